"""The serving configuration (the YAML file of `python -m halformer.serve` and of
halformer.serve.ray; its format is the package docstring): reading it, checking every key
and value (ConfigError naming the field), the defaults of the optional ones."""
import os
import re

KINDS = ("generate", "generate_stream", "embed_text", "pooled")
GENERATE_KINDS = ("generate", "generate_stream")
# The continuous-batching engine's keys of a generate model (halformer.Engine's arguments):
# (default, lowest, highest); kv_cache_mb 0: room for max_sequences of the model's max_len.
ENGINE_KEYS = {"max_sequences": (8, 1, 1024), "prefill_tokens": (512, 1, 1 << 20), "kv_cache_mb": (0, 0, 1 << 24)}


def engine_serves(config):
    """Whether halformer.Engine serves a model of this config (Model.config): decoders
    (docs/engine.md)."""
    return config["arch"] in ("decoder", "encoder_decoder")


def engine_for(model, entry):
    """halformer.Engine over `model` with a checked generate entry's ENGINE_KEYS."""
    import halformer
    return halformer.Engine(model, max_sequences=entry["max_sequences"], prefill_tokens=entry["prefill_tokens"],
                            kv_cache_mb=entry["kv_cache_mb"] or None)


DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_MAX_QUEUE_DELAY_US = 1000
# generate: a request decodes for a second or more, so waiting up to 20 ms for company costs
# ~1% of its latency and fills the batches (measured: docs/serving.md "Batching and throughput").
DEFAULT_GENERATE_QUEUE_DELAY_US = 20000
DEFAULT_MAX_TEXT_BYTES = 65536
# Triton model instances (each its own Python backend stub; calls into one Model, which
# runs concurrent calls): 2 lets one batch's requests and responses travel while
# another computes (docs/serving.md "Batching and throughput").
DEFAULT_INSTANCES = 2


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


def load_config(path, ray=False, openai=False):
    """The checked configuration: dict(server={...}, models=[{...}, ...]). Raises ConfigError.
    ray=True (halformer.serve.ray) also takes a per-model `replicas` (entry["replicas"], or
    absent: the command line's default). openai=True (halformer.serve.openai: generate kinds
    through the continuous-batching engine) takes `tokenizer` and the engine's keys instead
    of the batcher's keys and `instances`. Generate kinds take the engine's keys
    (`max_sequences`, `prefill_tokens`, `kv_cache_mb`) on every server: decoder-only and
    encoder-decoder models (engine_serves) generate through the engine there too
    (docs/engine.md)."""
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
        if openai:
            if kind not in GENERATE_KINDS:
                raise ConfigError(f"{where}: kind {kind} is not served by the OpenAI API (generate, generate_stream)")
            known = {"name", "kind", "model_dir", "weights", "threads", "tokenizer"}
        if kind in GENERATE_KINDS:
            known |= set(ENGINE_KEYS)
        if kind == "generate_stream":
            known -= {"max_batch_size", "max_queue_delay_microseconds"}
        if kind == "embed_text":
            known |= {"vocab", "max_text_bytes"}
        if openai:
            pass
        elif ray:
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
        if kind in GENERATE_KINDS:
            for key, (default, lo, hi) in ENGINE_KEYS.items():
                entry[key] = _int_field(where, m, key, default, lo, hi)
        if openai:
            entry["tokenizer"] = _path_field(where, m, "tokenizer", base) if "tokenizer" in m else None
        elif not ray:
            entry["instances"] = _int_field(where, m, "instances", DEFAULT_INSTANCES, 1, 64)
        models.append(entry)
    return dict(server=server, models=models)
