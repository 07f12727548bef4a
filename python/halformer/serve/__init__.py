"""halformer models behind Triton Inference Server (PyPI nvidia-pytriton), see docs/serving.md.

    python -m halformer.serve CONFIG.yaml [--http-port N] [--grpc-port N] [--metrics-port N]

CONFIG.yaml:

    server:                       # optional; ports default to Triton's 8000/8001/8002
      http_port: 8000
      grpc_port: 8001
      metrics_port: 8002
    models:
      - name: reverse             # Triton model name: [A-Za-z0-9._-]+, unique
        kind: generate            # generate | generate_stream | embed_text | pooled
        model_dir: build/models/reverse-tiny   # relative paths: relative to CONFIG.yaml
        weights: models/reverse-tiny.safetensors
        threads: 2                # Halide threads of this model (0: all cores)
        max_batch_size: 8         # Triton's max_batch_size (rows per batched call)
        max_queue_delay_microseconds: 2000     # dynamic batcher's wait for more requests
        instances: 2              # batches (generate_stream: streams) in flight at once (default 2)
      - name: minilm
        kind: embed_text
        model_dir: build/models/all-minilm-l6-v2
        weights: /path/model.safetensors
        vocab: /path/vocab.txt    # embed_text only
        max_text_bytes: 65536     # embed_text only: longer texts are rejected (default 65536)

Kinds (inputs and outputs carry Triton's batch dimension in front):
  generate:   INPUT_IDS int32 [-1]  -> OUTPUT_IDS int32 [-1], SCORES float32 [-1]
              (Model.generate with return_scores: SCORES holds each new token's
              log-probability, or with beam_size > 1 the best hypothesis' score; options as
              request parameters: max_new_tokens, beam_size, length_penalty, sampling_topk,
              sampling_topp, sampling_temperature, seed, repetition_penalty,
              no_repeat_ngram_size, min_length)
  generate_stream: INPUT_IDS int32 [1, -1] -> a stream of responses, each OUTPUT_IDS int32
              [1, 1] and SCORES float32 [1, 1]: one new token and its log-probability as
              soon as it is chosen (Model.generate_iter with return_scores; Triton's
              decoupled mode, gRPC streaming; the same tokens as generate; greedy or
              sampling options, not beam search); no batching keys: each request is its own
              stream (the rows of a dynamic batch would have to answer in lockstep)
  embed_text: TEXT bytes [1]        -> EMBEDDING float32 [d]   (SentenceEmbedder.encode)
  pooled:     INPUT_IDS int32 [-1]  -> OUTPUT float32 [X]      (Model.pooled)

The same file configures `python -m halformer.serve.ray` (Ray Serve, its own docstring),
which also takes a per-model `replicas:`; this Triton server refuses that key.

Each batch Triton's dynamic batcher forms goes to the Python API in one call (for
generate: one call per distinct set of options in the batch, and one per sampling request,
whose tokens would otherwise depend on its place in the batch; for embed_text: length-
sorted sub-batches of EMBED_SUB_BATCH texts inside that call). When that call fails, the
requests are run one by one, so that each bad request gets its own error response (the
Python API's message) and the others their results.
"""

import argparse
import logging
import os
import re
import signal
import sys
import time

import numpy as np

# embed_text runs a dynamic batch as length-sorted sub-batches of this many texts: a batch
# of 32 one-sentence requests (3-15 words) in one padded call ran at 365-408 sentences/s,
# in sub-batches of 16 at 455-464 (2-core Zen 3; docs/serving.md "Batching and throughput").
EMBED_SUB_BATCH = 16

KINDS = ("generate", "generate_stream", "embed_text", "pooled")
GENERATE_KINDS = ("generate", "generate_stream")
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_MAX_QUEUE_DELAY_US = 1000
# generate: a request decodes for a second or more, so waiting up to 20 ms for company costs
# ~1% of its latency and fills the batches: transformer-base greedy (32 new tokens), 32
# outstanding, max_batch_size 16, 2-core Zen 3, same run: 2 ms 14.0 req/s (p99 3128 ms),
# 20 ms 18.4 req/s (p99 1993 ms), the Python API at batch 16 20.1 (docs/serving.md).
DEFAULT_GENERATE_QUEUE_DELAY_US = 20000
DEFAULT_MAX_TEXT_BYTES = 65536
# Triton model instances (each its own Python backend stub; calls into one Model, which
# runs concurrent calls): 2 lets one batch's requests and responses travel while
# another computes. MiniLM, 2-core Zen 3: see docs/serving.md "Batching and throughput".
DEFAULT_INSTANCES = 2
GENERATE_PARAMETERS = {
    "max_new_tokens": int, "beam_size": int, "length_penalty": float, "sampling_topk": int, "sampling_topp": float, "sampling_temperature": float,
    "seed": int, "repetition_penalty": float, "no_repeat_ngram_size": int, "min_length": int,
}
ERROR_KEY = "__halformer_error__"

log = logging.getLogger("halformer.serve")


class ConfigError(Exception):
    """A bad serving configuration (raised before the server starts)."""


def _int_field(where, entry, key, default, lo, hi):
    v = entry.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where}: {key} must be an integer, got {v!r}")
    if not lo <= v <= hi:
        raise ConfigError(f"{where}: {key} {v} is outside [{lo}, {hi}]")
    return v


def _path_field(where, entry, key, base, must_be_dir=False):
    if key not in entry:
        raise ConfigError(f"{where}: missing {key}")
    v = entry[key]
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where}: {key} must be a path string, got {v!r}")
    p = os.path.normpath(os.path.join(base, os.path.expanduser(v)))
    if must_be_dir and not os.path.isdir(p):
        raise ConfigError(f"{where}: {key} {p!r} is not a directory")
    if not must_be_dir and not os.path.isfile(p):
        raise ConfigError(f"{where}: {key} {p!r} does not exist")
    return p


def load_config(path, ray=False):
    """The checked configuration: dict(server={...}, models=[{...}, ...]). Raises ConfigError.
    ray=True (halformer.serve.ray) also takes a per-model `replicas` (entry["replicas"], or
    absent: the command line's default)."""
    import yaml
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with 'models' (and optionally 'server')")
    unknown = set(raw) - {"server", "models"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {sorted(unknown)} (known: server, models)")
    base = os.path.dirname(os.path.abspath(path))
    server_raw = raw.get("server") or {}
    if not isinstance(server_raw, dict):
        raise ConfigError(f"{path}: server must be a mapping")
    unknown = set(server_raw) - {"http_port", "grpc_port", "metrics_port"}
    if unknown:
        raise ConfigError(f"{path}: server: unknown key(s) {sorted(unknown)}")
    server = {k: _int_field(f"{path}: server", server_raw, k, d, 1, 65535)
              for k, d in (("http_port", 8000), ("grpc_port", 8001), ("metrics_port", 8002))}
    models_raw = raw.get("models")
    if not isinstance(models_raw, list) or not models_raw:
        raise ConfigError(f"{path}: models must be a non-empty list")
    models, names = [], set()
    for i, m in enumerate(models_raw):
        where = f"{path}: models[{i}]"
        if not isinstance(m, dict):
            raise ConfigError(f"{where}: must be a mapping")
        name = m.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise ConfigError(f"{where}: name must match [A-Za-z0-9._-]+, got {name!r}")
        where = f"{path}: model {name!r}"
        if name in names:
            raise ConfigError(f"{where}: duplicate name")
        names.add(name)
        kind = m.get("kind")
        if kind not in KINDS:
            raise ConfigError(f"{where}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
        known = {"name", "kind", "model_dir", "weights", "threads", "max_batch_size", "max_queue_delay_microseconds"}
        if kind == "generate_stream":
            known -= {"max_batch_size", "max_queue_delay_microseconds"}
        if kind == "embed_text":
            known |= {"vocab", "max_text_bytes"}
        if ray:
            known.add("replicas")
            if "instances" in m:
                raise ConfigError(f"{where}: instances is for python -m halformer.serve (Triton); Ray Serve runs "
                                  f"replicas")
        else:
            known.add("instances")
            if "replicas" in m:
                raise ConfigError(f"{where}: replicas is for python -m halformer.serve.ray (Triton runs "
                                  f"`instances` of a model in one process)")
        unknown = set(m) - known
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)} for kind {kind} (known: {sorted(known)})")
        entry = dict(name=name, kind=kind,
                     model_dir=_path_field(where, m, "model_dir", base, must_be_dir=True),
                     weights=_path_field(where, m, "weights", base),
                     threads=_int_field(where, m, "threads", 0, 0, 1024),
                     max_batch_size=_int_field(where, m, "max_batch_size", DEFAULT_MAX_BATCH_SIZE, 1, 1024),
                     max_queue_delay_microseconds=_int_field(
                         where, m, "max_queue_delay_microseconds",
                         DEFAULT_GENERATE_QUEUE_DELAY_US if kind == "generate" else DEFAULT_MAX_QUEUE_DELAY_US, 0,
                         10_000_000))
        if kind == "embed_text":
            entry["vocab"] = _path_field(where, m, "vocab", base)
            entry["max_text_bytes"] = _int_field(where, m, "max_text_bytes", DEFAULT_MAX_TEXT_BYTES, 1, 1 << 24)
        if "replicas" in m:
            entry["replicas"] = _int_field(where, m, "replicas", 1, 1, 1024)
        if not ray:
            entry["instances"] = _int_field(where, m, "instances", DEFAULT_INSTANCES, 1, 64)
        models.append(entry)
    return dict(server=server, models=models)


def _error(msg):
    return {ERROR_KEY: np.array([msg.encode("utf-8")], dtype=np.bytes_)}


def _error_text(response):
    """The message of a response made by _error."""
    return bytes(response[ERROR_KEY].reshape(-1)[0]).decode("utf-8", "replace")


class _Served:
    """One configured model: loads it, declares its tensors, answers batches."""

    # the inputs' names in error messages (halformer.serve.ray shows its JSON keys instead)
    labels = {"INPUT_IDS": "INPUT_IDS", "TEXT": "TEXT"}

    def __init__(self, entry):
        import halformer
        self.entry = entry
        self.name = entry["name"]
        self.kind = entry["kind"]
        if self.kind == "embed_text":
            self.embedder = halformer.SentenceEmbedder(entry["model_dir"], entry["weights"], entry["vocab"],
                                                       threads=entry["threads"])
            self.model = self.embedder.model
        else:
            self.model = halformer.Model(entry["model_dir"], weights=entry["weights"], threads=entry["threads"])
        cfg = self.model.config
        if self.kind in GENERATE_KINDS and cfg["arch"] not in ("encoder_decoder", "decoder"):
            raise ConfigError(f"model {self.name!r}: kind {self.kind} needs an encoder-decoder or decoder model; "
                              f"{cfg['name']} is {cfg['arch']}")
        if self.kind == "pooled" and cfg["arch"] != "encoder":
            raise ConfigError(f"model {self.name!r}: kind pooled needs an encoder-only model; {cfg['name']} is {cfg['arch']}")
        self.vocab = cfg["src_vocab"]
        self.max_len = cfg["max_len"]
        if self.kind not in GENERATE_KINDS:  # the output width, from one call
            probe = (self.embedder.encode(["a"], convert_to_numpy=True) if self.kind == "embed_text"
                     else self.model.pooled([[min(1, self.vocab - 1)]]))
            self.width = int(probe.shape[1])

    def tensors(self):
        from pytriton.model_config import Tensor
        if self.kind == "generate_stream":  # no batching: the shapes are the whole tensors'
            return ([Tensor(name="INPUT_IDS", dtype=np.int32, shape=(1, -1))],
                    [Tensor(name="OUTPUT_IDS", dtype=np.int32, shape=(1, -1)),
                     Tensor(name="SCORES", dtype=np.float32, shape=(1, -1))])
        if self.kind == "generate":
            return ([Tensor(name="INPUT_IDS", dtype=np.int32, shape=(-1,))],
                    [Tensor(name="OUTPUT_IDS", dtype=np.int32, shape=(-1,)),
                     Tensor(name="SCORES", dtype=np.float32, shape=(-1,))])
        if self.kind == "embed_text":
            return [Tensor(name="TEXT", dtype=np.bytes_, shape=(1,))], [Tensor(name="EMBEDDING", dtype=np.float32, shape=(self.width,))]
        return [Tensor(name="INPUT_IDS", dtype=np.int32, shape=(-1,))], [Tensor(name="OUTPUT", dtype=np.float32, shape=(self.width,))]

    # --- per request: parse into rows (or an error message) ---
    def _ids_rows(self, req):
        name = self.labels["INPUT_IDS"]
        if "INPUT_IDS" not in req:
            return None, f"missing input {name} (got {sorted(req.keys())})"
        a = np.asarray(req["INPUT_IDS"])
        if a.ndim != 2:
            return None, f"{name} must be [batch, length], got shape {list(a.shape)}"
        if a.shape[0] < 1 or a.shape[1] < 1:
            return None, f"{name} is empty (shape {list(a.shape)}): send at least one token id"
        if self.kind in GENERATE_KINDS and a.shape[0] != 1:
            return None, f"generate takes one sequence per request ({name} shape [1, length]); got {a.shape[0]} rows"
        if a.shape[1] > self.max_len:
            return None, f"{name} has {a.shape[1]} tokens, more than the model's max_len {self.max_len}"
        bad = (a < 0) | (a >= self.vocab)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            return None, f"{name}[{r}][{c}] = {int(a[r, c])} is outside the vocabulary [0, {self.vocab})"
        return [list(map(int, row)) for row in a], None

    def _text_rows(self, req):
        name = self.labels["TEXT"]
        if "TEXT" not in req:
            return None, f"missing input {name} (got {sorted(req.keys())})"
        a = np.asarray(req["TEXT"])
        if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] != 1:
            return None, f"{name} must be [batch, 1] with batch >= 1, got shape {list(a.shape)}"
        rows = []
        for i, v in enumerate(a[:, 0]):
            b = v if isinstance(v, bytes) else bytes(v)
            if len(b) > self.entry["max_text_bytes"]:
                return None, (f"{name}[{i}] has {len(b)} bytes, more than max_text_bytes "
                              f"{self.entry['max_text_bytes']}")
            try:
                rows.append(b.decode("utf-8"))
            except UnicodeDecodeError as e:
                return None, f"{name}[{i}] is not valid UTF-8: {e}"
        return rows, None

    def _options(self, req):
        p = dict(getattr(req, "parameters", None) or {})
        opts = {}
        for k, v in p.items():
            if k not in GENERATE_PARAMETERS:
                continue  # Triton's own parameters (e.g. sequence ids) and unknown ones are ignored
            t = GENERATE_PARAMETERS[k]
            if t is int and (isinstance(v, bool) or not isinstance(v, int)):
                if isinstance(v, str) and re.fullmatch(r"-?[0-9]+", v):
                    v = int(v)
                else:
                    raise ValueError(f"parameter {k} must be an integer, got {v!r}")
            if t is float:
                if isinstance(v, bool):
                    raise ValueError(f"parameter {k} must be a number, got {v!r}")
                try:
                    v = float(v)
                except (TypeError, ValueError):
                    raise ValueError(f"parameter {k} must be a number, got {v!r}") from None
            opts[k] = v
        if self.kind == "generate_stream":
            for k in ("beam_size", "length_penalty"):
                if k in opts and not (k == "beam_size" and opts[k] == 1):
                    raise ValueError(f"parameter {k}: a stream sends greedy or sampled tokens one by one; beam "
                                     f"search needs kind generate")
            opts.pop("beam_size", None)
        # Scores move greedy's choice from the argmax kernel to the host (the step's logits
        # come down): made only for a request that asks for SCORES (Triton lists the
        # outputs wanted; Ray's requests all of them unless they say "scores": false).
        names = getattr(req, "requested_output_names", None)
        opts["return_scores"] = names is None or "SCORES" in names
        return opts

    def _run(self, rows, opts):
        if self.kind == "generate":
            out = self.model.generate(rows, **opts)
            if not opts["return_scores"]:
                return [{"OUTPUT_IDS": np.asarray([t], dtype=np.int32).reshape(1, -1)} for t in out]
            return [{"OUTPUT_IDS": np.asarray([d["tokens"]], dtype=np.int32).reshape(1, -1),
                     "SCORES": np.asarray([d["log_probs"] if "log_probs" in d else [d["score"]]],
                                          dtype=np.float32).reshape(1, -1)} for d in out]
        if self.kind == "embed_text":
            # Sorted by length into sub-batches (SentenceEmbedder.encode's own order), so that
            # short texts are not padded to the batch's longest.
            emb = self.embedder.encode(rows, batch_size=EMBED_SUB_BATCH, convert_to_numpy=True)
        else:
            emb = self.model.pooled(rows)
        return np.asarray(emb, dtype=np.float32)

    def infer(self, requests):
        """pytriton's callable: a list of requests -> a list of response dicts."""
        responses = [None] * len(requests)
        parsed = []  # (index, rows, options-key, options)
        for i, req in enumerate(requests):
            try:
                rows, err = self._text_rows(req) if self.kind == "embed_text" else self._ids_rows(req)
                opts = self._options(req) if self.kind == "generate" and err is None else {}
            except (ValueError, TypeError) as e:
                rows, err = None, str(e)
            if err is not None:
                responses[i] = _error(f"model {self.name!r}: {err}")
            else:
                parsed.append((i, rows, tuple(sorted(opts.items())), opts))
        groups = {}
        for item in parsed:
            # Sampling draws from one random stream per call (from `seed`), so a row's tokens
            # would depend on its place in the batch: a sampling request gets a call of its own,
            # and equals the Python API called with that request alone.
            key = item[2] if item[3].get("sampling_topk", 1) == 1 else ("alone", item[0])
            groups.setdefault(key, []).append(item)
        for items in groups.values():
            try:
                self._answer(items, responses)
            except (ValueError, TypeError) as e:  # one by one: each request its own error
                if len(items) == 1:
                    responses[items[0][0]] = _error(f"model {self.name!r}: {e}")
                    continue
                for item in items:
                    try:
                        self._answer([item], responses)
                    except (ValueError, TypeError) as e1:
                        responses[item[0]] = _error(f"model {self.name!r}: {e1}")
        return responses

    def stream(self, requests):
        """pytriton's callable for generate_stream (decoupled, no batching: one request):
        yields one response per new token, as Model.generate_iter chooses it."""
        for req in requests:  # Triton hands a model without batching one request at a time
            try:
                rows, err = self._ids_rows(req)
                opts = self._options(req) if err is None else {}
                tokens = None if err is not None else self.model.generate_iter(rows, **opts)
            except (ValueError, TypeError) as e:
                err = str(e)
            if err is not None:
                yield [_error(f"model {self.name!r}: {err}")]
                continue
            try:
                for _, token, *score in tokens:
                    r = {"OUTPUT_IDS": np.asarray([[token]], dtype=np.int32)}
                    if score:
                        r["SCORES"] = np.asarray([score], dtype=np.float32)
                    yield [r]
            except (ValueError, TypeError) as e:
                yield [_error(f"model {self.name!r}: {e}")]

    def _answer(self, items, responses):
        all_rows = [r for _, rows, _, _ in items for r in rows]
        out = self._run(all_rows, items[0][3])
        k = 0
        for i, rows, _, _ in items:
            n = len(rows)
            if self.kind == "generate":
                responses[i] = out[k]
            else:
                name = "EMBEDDING" if self.kind == "embed_text" else "OUTPUT"
                responses[i] = {name: np.ascontiguousarray(out[k:k + n])}
            k += n


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

    pm.Model.get_proxy_model_files = patched
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


def serve(config, ready_message=True):
    """Loads every model of a checked config, then serves them until SIGTERM/SIGINT."""
    from pytriton.model_config import DynamicBatcher, ModelConfig
    from pytriton.triton import Triton, TritonConfig

    served = []
    for entry in config["models"]:
        try:
            served.append(_Served(entry))
        except (ValueError, TypeError, FileNotFoundError) as e:
            raise ConfigError(f"model {entry['name']!r}: {e}") from None
    _install_patches()
    s = config["server"]
    tc = TritonConfig(http_port=s["http_port"], grpc_port=s["grpc_port"], metrics_port=s["metrics_port"],
                      exit_timeout_secs=30)  # pytriton kills tritonserver after 30 s anyway
    triton = Triton(config=tc)
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

    def on_term(signum, frame):
        raise KeyboardInterrupt  # Triton.serve() stops the server: in-flight requests finish first

    signal.signal(signal.SIGTERM, on_term)
    triton.run()
    if ready_message:
        print(f"halformer.serve: ready: {', '.join(m.name for m in served)} on http :{s['http_port']}, "
              f"grpc :{s['grpc_port']}, metrics :{s['metrics_port']}", flush=True)
    code = 0
    try:
        while triton.is_alive():
            time.sleep(1.0)
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
