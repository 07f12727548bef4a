"""The request handler shared by the Triton and Ray servers: _Served loads one configured
model and answers requests (input tensors -> checked rows and options -> one call of the
Python API per batch -> output tensors), each bad request with its own error response
(a dict holding ERROR_KEY, which the servers turn into their error)."""
import re

import numpy as np

from .config import GENERATE_KINDS, ConfigError, engine_for, engine_serves

# embed_text runs a dynamic batch as length-sorted sub-batches of this many texts: short
# texts are not padded to the batch's longest (docs/serving.md "Batching and throughput").
EMBED_SUB_BATCH = 16
GENERATE_PARAMETERS = {
    "max_new_tokens": int, "beam_size": int, "length_penalty": float, "sampling_topk": int, "sampling_topp": float, "sampling_temperature": float,
    "seed": int, "repetition_penalty": float, "no_repeat_ngram_size": int, "min_length": int,
}
ERROR_KEY = "__halformer_error__"


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
        # Generation goes through the continuous-batching engine (docs/engine.md) where it
        # serves the model: each request joins the running batch at its next step and leaves
        # when it ends. Beam search stays the model's.
        self.engine = None
        if self.kind in GENERATE_KINDS and engine_serves(cfg):
            self.engine = engine_for(self.model, entry)
        if self.kind == "pooled" and cfg["arch"] != "encoder":
            raise ConfigError(f"model {self.name!r}: kind pooled needs an encoder-only model; {cfg['name']} is {cfg['arch']}")
        self.vocab = cfg["tgt_vocab"] if cfg["arch"] == "decoder" else cfg["src_vocab"]  # the prompt's ids
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

    def _engine_takes(self, opts):
        """Whether these options run on the engine: not beam search, nor beam-only options
        (the model then refuses those by name, as the Python API does)."""
        return self.engine is not None and opts.get("beam_size", 1) == 1 and opts.get("length_penalty") is None

    def _engine_submit(self, row, opts):
        """One prompt into the engine (bad options raise here): its halformer.Stream."""
        o = {k: v for k, v in opts.items() if k not in ("beam_size", "length_penalty", "return_scores")}
        return self.engine.submit(row, return_scores=opts.get("return_scores", False), **o)

    @staticmethod
    def _engine_items(stream, scores):
        """Model.generate_iter's items, (0, token[, log-prob]), from an engine stream; closing
        the iterator (a client gone) ends the request."""
        try:
            for i, token in enumerate(stream):
                yield (0, token, stream.logprobs[i]) if scores else (0, token)
        finally:
            stream.close()

    def _generate(self, rows, opts):
        """Model.generate's result; greedy or sampled requests through the engine where it
        serves the model (every row its own request, all submitted before any is awaited),
        beam search on the model."""
        if not self._engine_takes(opts):
            return self.model.generate(rows, **opts)
        streams = []
        try:
            for r in rows:
                streams.append(self._engine_submit(r, opts))
        except Exception:  # a bad row: the rows already submitted are cancelled (infer() retries one by one)
            for s in streams:
                s.close()
            raise
        tokens = [list(s) for s in streams]
        if not opts.get("return_scores", False):
            return tokens
        return [{"tokens": t, "log_probs": s.logprobs} for t, s in zip(tokens, streams)]

    def _run(self, rows, opts):
        if self.kind == "generate":
            out = self._generate(rows, opts)
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
                if err is not None:
                    tokens = None
                elif self._engine_takes(opts):
                    tokens = self._engine_items(self._engine_submit(rows[0], opts), opts.get("return_scores", False))
                else:
                    tokens = self.model.generate_iter(rows, **opts)
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
