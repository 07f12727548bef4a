"""The Triton glue of `python -m halformer.serve`: the patches to the files pytriton 0.5.14
writes (one error response per bad request, ragged INPUT_IDS batches, instances that wait
for the handshake), binding each configured model to Triton, running the server until
SIGTERM/SIGINT, and the command line."""
import argparse
import errno
import logging
import signal
import socket
import sys
import time

from .config import ConfigError, load_config
from .handler import ERROR_KEY, _Served


_PATCH_ANCHOR = "def _wrap_response(response: Response, requested_outputs_names, model_outputs_dict):\n"
_PATCH = (_PATCH_ANCHOR +
          f"    if response.data is not None and {ERROR_KEY!r} in response.data:\n"
          f"        _msg = bytes(response.data[{ERROR_KEY!r}].reshape(-1)[0]).decode('utf-8', 'replace')\n"
          "        return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(_msg, pb_utils.TritonError.INVALID_ARG))  # pytype: disable=module-attr\n")


_EXECUTE_ANCHOR = "    def execute(self, triton_requests):\n"
_EXECUTE_PATCH = """    def execute(self, triton_requests):
        # halformer.serve: a request with an empty input gets its own error here (pytriton
        # cannot pass zero-size tensors on); the others go on as one batch.
        bad = {}
        for i, r in enumerate(triton_requests):
            for t in r.inputs():
                if 0 in list(t.shape()):
                    bad[i] = f"input {t.name()} is empty (shape {list(t.shape())}): send at least one element"
                    break
        if not bad:
            return self._halformer_execute(triton_requests)
        good = [r for i, r in enumerate(triton_requests) if i not in bad]
        if self._decoupled_model:  # a stream's error goes through its sender, as its last response
            for i, msg in bad.items():
                triton_requests[i].get_response_sender().send(
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(msg, pb_utils.TritonError.INVALID_ARG)),  # pytype: disable=module-attr
                    pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # pytype: disable=module-attr
            return self._halformer_execute(good) if good else None
        done = iter(self._halformer_execute(good) if good else [])
        return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(bad[i], pb_utils.TritonError.INVALID_ARG))  # pytype: disable=module-attr
                if i in bad else next(done) for i in range(len(triton_requests))]

    def _halformer_execute(self, triton_requests):
"""


_HANDSHAKE_ANCHOR = "                inference_handler_config = get_config_from_handshake_server(handshake_socket)\n"
_HANDSHAKE_PATCH = """                # halformer.serve: instances start in parallel; instance 0 may not listen on its
                # handshake socket yet (pytriton 0.5.14 connects once: 2 of 6 starts failed
                # with 2 instances): retry for up to 60 s.
                import time as _time
                for _attempt in range(600):
                    try:
                        inference_handler_config = get_config_from_handshake_server(handshake_socket)
                        break
                    except (ConnectionRefusedError, FileNotFoundError, TimeoutError):
                        if _attempt == 599:
                            raise
                        _time.sleep(0.1)
"""


def _install_patches():
    """pytriton 0.5.14 answers a whole batch with one error; halformer wants one error per
    bad request. The proxy model file pytriton copies into Triton's model repository is
    patched so that a response dict holding ERROR_KEY becomes that request's error response,
    and so that a model's later instances wait for the first one's handshake server."""
    from pytriton.models import model as pm
    if getattr(pm.Model, "_halformer_patched", False):
        return
    original = pm.Model.get_proxy_model_files

    def patched(self):
        files = original(self)
        for key, content in files.items():
            if key.endswith("/model.py"):
                text = content.decode("utf-8")
                for anchor, patch in ((_PATCH_ANCHOR, _PATCH), (_EXECUTE_ANCHOR, _EXECUTE_PATCH),
                                      (_HANDSHAKE_ANCHOR, _HANDSHAKE_PATCH)):
                    if text.count(anchor) != 1:
                        raise RuntimeError("halformer.serve: pytriton's proxy model.py changed; "
                                           "per-request errors need nvidia-pytriton==0.5.14")
                    text = text.replace(anchor, patch, 1)
                files[key] = text.encode("utf-8")
        return files

    original_generate = pm.Model.generate_model

    def generate_model(self, model_repository):
        # The model store is written before tritonserver starts (serve(): a local store);
        # pytriton copies its proxy files there unpatched: overwrite them with the patched.
        original_generate(self, model_repository)
        for key, content in self.get_proxy_model_files().items():
            (model_repository / self.model_name / key[len("file:"):]).write_bytes(content)

    pm.Model.get_proxy_model_files = patched
    pm.Model.generate_model = generate_model
    pm.Model._halformer_patched = True

    # Variable-length INPUT_IDS: without allow_ragged_batch Triton's dynamic batcher
    # batches only requests of equal shape; the Python API takes rows of any length.
    from pytriton.model_config import generator as pg
    original_config = pg.ModelConfigGenerator.get_config

    def get_config(self):
        config = original_config(self)
        for item in config.get("input", []):
            if item.get("name") == "INPUT_IDS":
                item["allow_ragged_batch"] = True
        return config

    pg.ModelConfigGenerator.get_config = get_config


# tritonserver loads every model before it opens its ports (a local model store, below);
# once in a fresh-clone CI run with another Triton starting beside it, that load failed
# ("failed to load all models"; not reproduced in 16 starts, 4 at a time under load). The
# models' Python side is already loaded, so a failed start is tried again.
START_ATTEMPTS = 3


def _bind(served, tc):
    """A Triton (not started) with every served model bound."""
    from pytriton.model_config import DynamicBatcher, ModelConfig
    from pytriton.triton import Triton, TritonLifecyclePolicy

    # A local model store: every model is written before tritonserver starts, which loads
    # them all before its /v2/health/ready first says 200 (pytriton's default loads them
    # through the API after start: ready for about a second with no model).
    triton = Triton(config=tc, triton_lifecycle_policy=TritonLifecyclePolicy(launch_triton_on_startup=True,
                                                                            local_model_store=True))
    for m in served:
        inputs, outputs = m.tensors()
        if m.kind == "generate_stream":
            triton.bind(model_name=m.name, infer_func=[m.stream] * m.entry["instances"], inputs=inputs, outputs=outputs,
                        config=ModelConfig(batching=False, decoupled=True), strict=False)
            continue
        triton.bind(model_name=m.name, infer_func=[m.infer] * m.entry["instances"], inputs=inputs, outputs=outputs,
                    config=ModelConfig(max_batch_size=m.entry["max_batch_size"],
                                       batcher=DynamicBatcher(
                                           max_queue_delay_microseconds=m.entry["max_queue_delay_microseconds"])),
                    strict=False)
    return triton


def _in_use(port):
    """Whether a process listens on the TCP port (a bind to it fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed server's TIME_WAIT is not "in use"
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE  # other errors (a privileged port): tritonserver's to report
    return False


def serve(config, ready_message=True):
    """Loads every model of a checked config, then serves them until SIGTERM/SIGINT."""
    from pytriton.triton import TritonConfig

    s = config["server"]
    for key in ("http_port", "grpc_port", "metrics_port"):
        if _in_use(s[key]):  # tritonserver would not say so: pytriton times out after a minute
            raise ConfigError(f"{key.replace('_', ' ')} {s[key]} is in use by another process")
    served = []
    for entry in config["models"]:
        try:
            served.append(_Served(entry))
        except (ValueError, TypeError, FileNotFoundError) as e:
            raise ConfigError(f"model {entry['name']!r}: {e}") from None
    _install_patches()
    tc = TritonConfig(http_port=s["http_port"], grpc_port=s["grpc_port"], metrics_port=s["metrics_port"],
                      exit_timeout_secs=30)  # pytriton kills tritonserver after 30 s anyway

    # SIGTERM while Triton starts is kept for later: tritonserver takes requests as soon as
    # its models load, before pytriton connects their Python side, so the start is finished
    # (those requests answered) and then the server is stopped as below.
    term = {"starting": True, "pending": False}

    def on_term(signum, frame):
        if term["starting"]:
            term["pending"] = True
            return
        raise KeyboardInterrupt  # Triton.serve() stops the server: in-flight requests finish first

    signal.signal(signal.SIGTERM, on_term)
    for attempt in range(1, START_ATTEMPTS + 1):
        triton = _bind(served, tc)
        try:
            triton.run()
            break
        except Exception as e:  # tritonserver exited, e.g. on a model it could not load (its log says why)
            triton.stop()
            again = attempt < START_ATTEMPTS
            print(f"halformer.serve: {'warning' if again else 'error'}: Triton did not start ({type(e).__name__}: "
                  f"{e}); tritonserver's log above says why" + (f"; starting it again ({attempt + 1} of "
                                                                 f"{START_ATTEMPTS})" if again else ""),
                  file=sys.stderr, flush=True)
            if not again or term["pending"]:
                return 1
    if ready_message and not term["pending"]:
        print(f"halformer.serve: ready: {', '.join(m.name for m in served)} on http :{s['http_port']}, "
              f"grpc :{s['grpc_port']}, metrics :{s['metrics_port']}", flush=True)
    code = 0
    try:
        term["starting"] = False  # in the try: a SIGTERM from here on raises KeyboardInterrupt into it
        while triton.is_alive() and not term["pending"]:
            time.sleep(1.0)
        if not term["pending"]:
            print("halformer.serve: tritonserver is gone", file=sys.stderr, flush=True)
            code = 1
    except KeyboardInterrupt:
        pass
    triton.stop()  # SIGINT to tritonserver: it stops taking requests and finishes those in flight
    print("halformer.serve: stopped", flush=True)
    return code


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m halformer.serve",
                                 description="Serve halformer models through Triton Inference Server (docs/serving.md).")
    ap.add_argument("config", help="YAML configuration (see the module docstring)")
    ap.add_argument("--http-port", type=int)
    ap.add_argument("--grpc-port", type=int)
    ap.add_argument("--metrics-port", type=int)
    ap.add_argument("--check", action="store_true", help="check the configuration and load the models, then exit")
    ap.add_argument("--log-level", default="WARNING")
    args = ap.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = load_config(args.config)
        for k in ("http_port", "grpc_port", "metrics_port"):
            v = getattr(args, k)
            if v is not None:
                if not 1 <= v <= 65535:
                    raise ConfigError(f"--{k.replace('_', '-')} {v} is outside [1, 65535]")
                config["server"][k] = v
        ports = [config["server"][k] for k in ("http_port", "grpc_port", "metrics_port")]
        if len(set(ports)) != 3:
            raise ConfigError(f"http, grpc and metrics ports must differ, got {ports}")
        if args.check:
            for entry in config["models"]:
                try:
                    _Served(entry)
                except (ValueError, TypeError, FileNotFoundError) as e:
                    raise ConfigError(f"model {entry['name']!r}: {e}") from None
            print(f"halformer.serve: {args.config}: ok ({len(config['models'])} models)")
            return 0
        return serve(config)
    except ConfigError as e:
        print(f"halformer.serve: error: {e}", file=sys.stderr)
        return 2
    return 0
