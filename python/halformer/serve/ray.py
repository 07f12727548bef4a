"""halformer models on Ray Serve: N replicas per model and Ray's request batching; see docs/serving.md.

    python -m halformer.serve.ray CONFIG.yaml [--replicas N] [--port P] [--host H] [--address ADDR] [--check]

CONFIG.yaml is the file `python -m halformer.serve` (Triton) takes, see its docstring, with
one more optional key per model: `replicas` (default: --replicas, which defaults to 1).
Used here: server.http_port (--port overrides it; the grpc and metrics ports are Triton's
only), and per model name, kind, model_dir, weights, vocab, threads, max_text_bytes;
max_batch_size and max_queue_delay_microseconds become @serve.batch's max_batch_size and
batch_wait_timeout_s. Each model is one Ray Serve application at route /<name>:

    POST /<name>  generate:   {"input_ids": [3, 7, 1, 9], "max_new_tokens": 10}  -> {"output_ids": [9, 1, 7, 3, 15],
                                                                  "scores": [5 log-probabilities]}
                              (options: the Triton server's request parameters, as JSON keys)
                  generate_stream: the same request (greedy or sampling options) -> server-sent
                              events, one per new token as it is chosen: data: {"output_id": 9,
                              "score": -0.01} ... (its log-probability; "scores": false: ids only)
                  embed_text: {"text": "A man is eating food."}                  -> {"embedding": [384 floats]}
                  pooled:     {"input_ids": [101, 7592, 102]}                     -> {"output": [floats]}
    GET  /<name>  the model's description (kind, vocabulary, max_len, batching)
    GET  /-/ready  readiness: 200 once every model's replicas have all loaded it, else 503
                  (or 404 before the route exists); Ray's /-/healthz is ready earlier

A bad request gets HTTP 400 with {"error": "<the problem>"} (413: body too large, 405: a
method other than GET/POST); the replica goes on serving. Answers carry the header
x-halformer-replica (the replica's process id), and those from the model also
x-halformer-batch-size (how many requests the @serve.batch batch they ran in held; sampling
requests of generate then run one call each, as in the Triton server).

Without --address a local Ray instance is started (num_cpus: enough for every replica,
at least the machine's cores; its files under $RAY_TMPDIR/ray, default /tmp/ray; usage
stats off unless RAY_USAGE_STATS_ENABLED is set) and shut down on exit. With --address the
applications go to that Ray cluster (`ray start --head` / `ray start --address=...`);
every node then needs the model files and the halformer package at the same paths (the
replicas get this process's halformer directory on their PYTHONPATH), and only these
applications are deleted on exit. SIGTERM or SIGINT: the applications drain (replicas
finish the requests they hold, the answers are delivered), then exit 0.
"""

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import warnings

import numpy as np
from ray import serve
from ray.serve.schema import ApplicationStatus
from starlette.responses import JSONResponse, StreamingResponse

from halformer.serve.config import GENERATE_KINDS, ConfigError, load_config
from halformer.serve.handler import ERROR_KEY, GENERATE_PARAMETERS, _error_text, _Served

READY_APP, READY_ROUTE = "halformer-ready", "/-/ready"  # beside Ray's /-/healthz, /-/routes
MAX_BODY_BYTES = 1 << 20  # per request, plus 6 bytes per byte of max_text_bytes (JSON's \uXXXX)
OUTPUT_KEY = {"generate": ("OUTPUT_IDS", "output_ids"), "embed_text": ("EMBEDDING", "embedding"),
              "pooled": ("OUTPUT", "output")}
EXAMPLE = {"generate": '{"input_ids": [3, 7, 1, 9], "max_new_tokens": 10}',  # answer: output_ids, scores
           "generate_stream": '{"input_ids": [3, 7, 1, 9], "max_new_tokens": 10}',  # answer: events
           "embed_text": '{"text": "A man is eating food."}', "pooled": '{"input_ids": [101, 7592, 102]}'}


class _BadRequest(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class _Request(dict):
    """A request as _Served.infer takes it (Triton's shapes: a batch dimension in front;
    generation options in .parameters)."""

    def __init__(self, inputs, parameters=None, requested_output_names=None):
        super().__init__(inputs)
        self.parameters = parameters or {}
        self.requested_output_names = requested_output_names  # None: all outputs


class ModelDeployment:
    """One replica of one configured model (the deployment class; see _application)."""

    def __init__(self, entry):
        self.served = _Served(entry)
        self.served.labels = {"INPUT_IDS": "input_ids", "TEXT": "text"}
        self.name, self.kind = entry["name"], entry["kind"]
        self.max_body = MAX_BODY_BYTES + 6 * entry.get("max_text_bytes", 0)
        self.batched.set_max_batch_size(entry["max_batch_size"])
        self.batched.set_batch_wait_timeout_s(entry["max_queue_delay_microseconds"] / 1e6)
        self.headers = {"x-halformer-replica": str(os.getpid())}
        cfg = self.served.model.config
        self.info = dict(name=self.name, kind=self.kind, model=cfg["name"], arch=cfg["arch"],
                         vocab=self.served.vocab, max_len=self.served.max_len,
                         max_batch_size=entry["max_batch_size"],
                         batch_wait_timeout_s=entry["max_queue_delay_microseconds"] / 1e6,
                         request=json.loads(EXAMPLE[self.kind]))
        if self.kind in GENERATE_KINDS:
            self.info["options"] = sorted(GENERATE_PARAMETERS)
        else:
            self.info["width"] = self.served.width
        if self.kind == "embed_text":
            self.info["max_text_bytes"] = entry["max_text_bytes"]

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.001)  # set from the config in __init__
    async def batched(self, requests):
        """One call of the Python API for the whole batch (one per set of options for generate);
        a bad request fails alone (_Served.infer). Runs in a thread: the replica's event loop
        keeps queueing the next batch meanwhile. -> [(status, body, batch size)]"""
        n = len(requests)
        try:
            responses = await asyncio.to_thread(self.served.infer, requests)
        except Exception as e:  # not a bad request (those come back one by one): the model itself failed
            return [(500, {"error": f"model {self.name!r}: {type(e).__name__}: {e}"}, n)] * n
        out = []
        for r in responses:
            if ERROR_KEY in r:
                out.append((400, {"error": _error_text(r)}, n))
            else:
                tensor, key = OUTPUT_KEY[self.kind]
                body = {key: r[tensor][0].tolist()}
                if "SCORES" in r:  # per-token log-probabilities, or the beam's score
                    body["scores"] = r["SCORES"][0].tolist()
                out.append((200, body, n))
        return out

    async def __call__(self, request):
        if request.method == "GET":
            return JSONResponse(self.info, headers=self.headers)
        try:
            if request.method != "POST":
                raise _BadRequest(405, f"method {request.method}: POST a request such as {EXAMPLE[self.kind]} "
                                       f"(GET: the model's description)")
            req = self._parse(await self._body(request))
        except _BadRequest as e:
            return JSONResponse({"error": f"model {self.name!r}: {e}"}, status_code=e.status, headers=self.headers)
        if self.kind == "generate_stream":
            return await self._stream(req)
        status, body, n = await self.batched(req)
        return JSONResponse(body, status_code=status, headers={**self.headers, "x-halformer-batch-size": str(n)})

    async def _stream(self, req):
        """generate_stream: server-sent events, one `data: {"output_id": t, "score": log-prob}`
        per new token as soon as it is chosen (_Served.stream, each step pulled in a thread). A request the
        model refuses before its first token gets HTTP 400 with {"error": ...}; a failure
        after it, one `data: {"error": ...}` event."""
        tokens = self.served.stream([req])

        def pull():
            r = next(tokens, None)
            return None if r is None else r[0]

        first = await asyncio.to_thread(pull)
        if first is not None and ERROR_KEY in first:
            return JSONResponse({"error": _error_text(first)}, status_code=400, headers=self.headers)

        async def events(r):
            try:
                while r is not None:
                    if ERROR_KEY in r:
                        yield f"data: {json.dumps({'error': _error_text(r)})}\n\n"
                        return
                    event = {"output_id": int(r["OUTPUT_IDS"][0, 0])}
                    if "SCORES" in r:  # the token's log-probability
                        event["score"] = float(r["SCORES"][0, 0])
                    yield f"data: {json.dumps(event)}\n\n"
                    r = await asyncio.to_thread(pull)
            finally:  # also when the client goes away: the decode stops (generate_iter's close)
                tokens.close()

        return StreamingResponse(events(first), media_type="text/event-stream", headers=self.headers)

    async def _body(self, request):
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > self.max_body:
            raise _BadRequest(413, f"request body of {size} bytes is over the limit of {self.max_body}")
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > self.max_body:
                raise _BadRequest(413, f"request body is over the limit of {self.max_body} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _parse(self, body):
        """JSON body -> _Request; the checks that need the model (vocabulary, max_len, byte
        limit, option values) are _Served's, in the batch."""
        try:
            obj = json.loads(body)
        except (UnicodeDecodeError, ValueError) as e:
            raise _BadRequest(400, f"request body is not valid JSON ({e}); send e.g. {EXAMPLE[self.kind]}") from None
        if not isinstance(obj, dict):
            raise _BadRequest(400, f"request body must be a JSON object such as {EXAMPLE[self.kind]}, "
                                   f"got {type(obj).__name__}")
        key = "text" if self.kind == "embed_text" else "input_ids"
        known = {key} | (set(GENERATE_PARAMETERS) | {"scores"} if self.kind in GENERATE_KINDS else set())
        unknown = set(obj) - known
        if unknown:
            raise _BadRequest(400, f"unknown key(s) {sorted(unknown)} (known: {sorted(known)})")
        if key not in obj:
            raise _BadRequest(400, f"missing \"{key}\"; send e.g. {EXAMPLE[self.kind]}")
        v = obj[key]
        if self.kind == "embed_text":
            if not isinstance(v, str):
                raise _BadRequest(400, f"\"text\" must be a string, got {type(v).__name__}")
            return _Request({"TEXT": np.array([[v.encode("utf-8", "surrogatepass")]], dtype=object)})
        if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            raise _BadRequest(400, f"\"input_ids\" must be a flat list of integer token ids, got {json.dumps(v)[:80]}")
        ids = np.array(v, dtype=object).reshape(1, -1)  # any int: _Served checks the vocabulary
        # "scores": false leaves them out: greedy then keeps its choice on the argmax kernel
        # (scores bring each step's logits to the host)
        scores = obj.get("scores", True)
        if not isinstance(scores, bool):
            raise _BadRequest(400, f"\"scores\" must be true or false, got {json.dumps(scores)[:80]}")
        return _Request({"INPUT_IDS": ids}, {k: obj[k] for k in obj if k not in (key, "scores")},
                        None if scores else ["OUTPUT_IDS"])


class ReadyDeployment:
    """GET /-/ready: 200 once every model's application is RUNNING (each of its replicas has
    loaded the model), else 503 naming those that are not. Ray's own /-/healthz says 200 as
    soon as the routes exist, before any replica has loaded (requests then wait in Ray's router)."""

    def __init__(self, names):
        self.names = names

    async def __call__(self, request):
        apps = (await asyncio.to_thread(serve.status)).applications
        waiting = {n: apps[n].status.value if n in apps else "NOT_DEPLOYED" for n in self.names
                   if n not in apps or apps[n].status != ApplicationStatus.RUNNING}
        if waiting:
            return JSONResponse({"ready": False, "not_running": waiting}, status_code=503)
        return JSONResponse({"ready": True, "models": self.names})


def _application(entry):
    return serve.deployment(ModelDeployment).options(
        name=entry["name"], num_replicas=entry["replicas"],
        max_ongoing_requests=2 * entry["max_batch_size"],  # Ray's default (5) would cap the batches
        graceful_shutdown_wait_loop_s=0.2,  # a stopping replica checks this often whether it is idle
        ray_actor_options={"num_cpus": entry["threads"] or 1}).bind(entry)


def _drain(names, timeout_s=60):
    """Deletes these applications and waits until they are gone: their replicas stop taking
    requests and finish those they hold (the proxies deliver the answers), then stop."""
    try:
        for name in names:
            serve.delete(name, _blocking=False)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and set(names) & set(serve.status().applications):
            time.sleep(0.2)
    except Exception as e:  # Serve never started, or is gone already
        print(f"halformer.serve.ray: drain: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def serve_ray(config, host, port, address=None, log_level=logging.WARNING):
    """Deploys every model of a checked config (entry["replicas"] set), serves until SIGTERM/SIGINT."""
    import ray
    models = config["models"]
    if address:  # replicas import halformer from where this process found it (same path on every node)
        import halformer
        package_dir = os.path.dirname(os.path.dirname(os.path.abspath(halformer.__file__)))
        python_path = os.pathsep.join(p for p in (package_dir, os.environ.get("PYTHONPATH")) if p)
        ray.init(address=address, logging_level=log_level, runtime_env={"env_vars": {"PYTHONPATH": python_path}})
    else:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Ray's proxy (uvicorn) binds
            try:  # Ray's proxy would fail on a taken port only after Ray and the replicas start
                sock.bind((host, port))
            except OSError as e:
                print(f"halformer.serve.ray: error: cannot listen on {host}:{port}: {e.strerror}", file=sys.stderr)
                return 1
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        cpus = max(os.cpu_count() or 1, sum(m["replicas"] * (m["threads"] or 1) for m in models))
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=log_level)
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):  # after ray.init, which installs its own (crash) handlers
        signal.signal(s, lambda signum, frame: stop.set())
    code = 0
    try:
        logs = {"log_level": logging.getLevelName(log_level)}
        serve.start(http_options={"host": host, "port": port}, logging_config=logs)
        ready = serve.deployment(ReadyDeployment).options(name="ready", ray_actor_options={"num_cpus": 0})
        serve.run_many([serve.RunTarget(_application(m), name=m["name"], route_prefix=f"/{m['name']}",
                                        logging_config=logs) for m in models] +
                       [serve.RunTarget(ready.bind([m["name"] for m in models]), name=READY_APP,
                                        route_prefix=READY_ROUTE, logging_config=logs)])
        url = f"http://{'localhost' if host in ('0.0.0.0', '::') else host}:{port}"
        names = ", ".join(f"{m['name']} ({m['replicas']} replicas)" for m in models)
        print(f"halformer.serve.ray: ready: {names} at {url}/<name>", flush=True)
        while not stop.wait(1.0):
            pass
    except Exception as e:  # a deployment that cannot start (e.g. a replica failing in __init__)
        lines = str(e).strip().splitlines() or [type(e).__name__]  # Ray's errors end with the cause
        print(f"halformer.serve.ray: error: {lines[-1]}", file=sys.stderr, flush=True)
        code = 1
    finally:
        _drain([m["name"] for m in models] + [READY_APP])
        if not address:
            serve.shutdown()
        ray.shutdown()
    print("halformer.serve.ray: stopped", flush=True)
    return code


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m halformer.serve.ray",
                                 description="Serve halformer models on Ray Serve (docs/serving.md).")
    ap.add_argument("config", help="YAML configuration (python -m halformer.serve's, plus replicas per model)")
    ap.add_argument("--replicas", type=int, default=1, help="replicas of each model without a replicas: key")
    ap.add_argument("--port", type=int, help="HTTP port (default: the config's server.http_port, else 8000)")
    ap.add_argument("--host", default="0.0.0.0", help="HTTP address to listen on (default 0.0.0.0)")
    ap.add_argument("--address", help="a running Ray cluster (e.g. HEAD:6379) instead of a local instance")
    ap.add_argument("--check", action="store_true", help="check the configuration and load the models, then exit")
    ap.add_argument("--log-level", default="WARNING")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message="Tip: In future versions of Ray")  # not about CPU replicas
    level = getattr(logging, args.log_level.upper(), None)
    if not isinstance(level, int):
        print(f"halformer.serve.ray: error: --log-level {args.log_level!r} is not a logging level", file=sys.stderr)
        return 2
    logging.basicConfig(level=level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    serve_log = logging.getLogger("ray.serve")
    serve_log.setLevel(level)
    # serve.run_many checks Serve's default HTTP options against ours and warns that they
    # are ignored; ours (serve.start) are the ones in effect.
    serve_log.addFilter(lambda record: "HTTP config differs" not in record.getMessage())
    try:
        config = load_config(args.config, ray=True)
        if not 1 <= args.replicas <= 1024:
            raise ConfigError(f"--replicas {args.replicas} is outside [1, 1024]")
        port = config["server"]["http_port"] if args.port is None else args.port
        if not 1 <= port <= 65535:
            raise ConfigError(f"--port {port} is outside [1, 65535]")
        for entry in config["models"]:
            entry.setdefault("replicas", args.replicas)
            try:
                _Served(entry)  # load once here: a bad model is a clear error before Ray starts
            except (ValueError, TypeError, FileNotFoundError) as e:
                raise ConfigError(f"model {entry['name']!r}: {e}") from None
    except ConfigError as e:
        print(f"halformer.serve.ray: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(f"halformer.serve.ray: {args.config}: ok ({len(config['models'])} models)")
        return 0
    return serve_ray(config, args.host, port, args.address, level)


if __name__ == "__main__":
    # Run main() from the module under its own name, so that Ray pickles ModelDeployment by
    # reference (replicas import halformer.serve.ray) rather than as __main__'s.
    from halformer.serve import ray as _module
    sys.exit(_module.main())
