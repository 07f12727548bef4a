"""halformer: run models built from a YAML spec (``halformer build``) from Python.

    import halformer
    halformer.build("models/reverse-tiny.yaml", "out/reverse-tiny")   # runs the CLI
    m = halformer.Model("out/reverse-tiny", weights="models/reverse-tiny.safetensors")
    m.generate([[3, 7, 1, 9]])                       # [[9, 1, 7, 3, 15]]
    m.generate([[3, 7, 1, 9]], beam_size=3, return_scores=True)
    for row, token in m.generate_iter([[3, 7, 1, 9], [5, 6]]): ...
    m.encode([[3, 7, 1, 9]])                         # numpy float32 [1, 4, d_model]

    e = halformer.SentenceEmbedder("out/all-minilm-l6-v2", weights, vocab)
    e.encode(["A man is eating food.", "Someone eats."])   # numpy float32 [2, 384]

API
  build(spec, out_dir)       runs ``halformer build SPEC -o OUT_DIR`` (the CLI of the
                             source tree this package was built from, or $HALFORMER_TOOL),
                             its output streamed to sys.stdout; returns OUT_DIR.
  Model(model_dir, weights, device="cpu", threads=0, tokenizer=None)
                             loads DIR/lib<name>.so (or that .so's path) with the weights.
                             threads: per-call thread limit (<= 0: every core).
                             tokenizer: a Hugging Face `tokenizers.Tokenizer` (or the path of
                             a tokenizer.json): then every method also takes a str or a list
                             of str where it takes token ids (encoded without special tokens
                             unless the tokenizer's post-processor adds them), and generate()
                             of text returns text (the new tokens, decoded with
                             skip_special_tokens=True).
    .config                  dict of the spec's values (halformer/model_config.h)
    .encode(batch, lengths=None)    encoder output, float32 [B, T, d_model]
    .pooled(batch, lengths=None)    head vector per sequence, [B, num_classes | d_model]
    .score(src, tgt=None, ...)      head output [B, T, tgt_vocab] (tgt: teacher-forced
                             decoder inputs, encoder-decoder; decoder-only: over src)
    .generate(src, max_new_tokens=None, beam_size=1, length_penalty=None,
              sampling_topk=1, sampling_topp=1.0, sampling_temperature=1.0, seed=0,
              repetition_penalty=1.0, no_repeat_ngram_size=0, min_length=0,
              return_scores=False)
                             a list of token lists (new tokens, eos included when made);
                             beam_size > 1: the best hypothesis per source. With
                             return_scores: a list of dicts {"tokens", "log_probs"} (one
                             log-probability per token), or for beam search
                             {"tokens", "score"} (sum of log-probs / length^penalty).
                             Option semantics: halformer/generation.h (Hugging Face's).
    .generate_iter(src, ...)  the same options (not beam search): yields (row, token) as
                             each token is chosen, with return_scores (row, token,
                             log_prob), the log_probs generate() returns; generation runs
                             in a background thread.
  SentenceEmbedder(model_dir, weights, vocab, max_seq_length=None, device="cpu", threads=0)
    .encode(sentences, batch_size=32, show_progress_bar=None,
            convert_to_numpy=True, normalize_embeddings=False)
                             sentence-transformers 2.2.2's SentenceTransformer.encode for
                             these arguments (tokenized by halformer's C++ BertTokenizer).
  BertTokenizer.from_vocab_file(path)   .encode(text, max_length), .encode_batch(...),
                             .tokenize(text): halformer/tokenizer.h.

A batch is a list of token-id lists (lengths may differ) or a 2-D integer numpy array
(with ``lengths=``: row i is its first lengths[i] ids). Errors: ValueError for bad
values (ids outside the vocabulary, sequences too long, an empty batch, options out of
range, weights that do not fit the model) with the runtime's message; TypeError for
wrong types; FileNotFoundError for a missing model directory, weights or vocabulary.

Models are independent values: several (the same or different ones) live in one process
and may be called from several Python threads at once; the GIL is released while the
kernels run.
"""
import logging
import math
import numbers
import os
import pathlib
import queue
import subprocess
import sys
import threading

import numpy as np

from . import _native
from ._native import BertTokenizer

try:
    from ._build_info import HALFORMER_TOOL as _BUILT_TOOL
except ImportError:  # pragma: no cover - a package assembled by hand
    _BUILT_TOOL = None

__all__ = ["build", "Model", "SentenceEmbedder", "BertTokenizer"]
logger = logging.getLogger(__name__)


# ---- building -----------------------------------------------------------------------

def _tool():
    tool = os.environ.get("HALFORMER_TOOL") or _BUILT_TOOL
    if not tool or not os.path.isfile(tool):
        raise FileNotFoundError(
            f"the halformer CLI was not found at {tool!r}: build the project (cmake --build --preset default) "
            "or set HALFORMER_TOOL to the path of build/bin/halformer")
    return tool


PRECISIONS = ("fp32", "int8", "bf16")


def build(spec, out_dir, precision=None):
    """Builds the model of SPEC (a YAML file) into OUT_DIR with the halformer CLI:
    OUT_DIR/<name> (inference binary), lib<name>.so (for Model), lib<name>.a, <name>.h.
    precision: "fp32", "int8" or "bf16" instead of the spec's `precision:` (as
    `halformer build --precision`; docs/precision.md); None keeps the spec's.
    The CLI's output is streamed to sys.stdout; a failure raises
    subprocess.CalledProcessError (its .output holds what was printed). Returns OUT_DIR."""
    spec, out_dir = os.fspath(spec), os.fspath(out_dir)
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)} (or None: the spec's)")
    if not os.path.isfile(spec):
        raise FileNotFoundError(f"spec {spec!r}: no such file")
    cmd = [_tool(), "build", spec, "-o", out_dir] + (["--precision", precision] if precision else [])
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", bufsize=1) as p:
        for line in p.stdout:
            lines.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()
    if p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, cmd, output="".join(lines))
    return pathlib.Path(out_dir)


# ---- argument checks ------------------------------------------------------------------

def _is_int(v):
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def _int_arg(name, v, bits=None):
    """int(v); TypeError unless an integer, ValueError outside a signed `bits`-bit int."""
    if not _is_int(v):
        raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if bits and not -2**(bits - 1) <= v < 2**(bits - 1):
        raise ValueError(f"{name} {int(v)} is out of range (not a {bits}-bit int)")
    return int(v)


def _float_arg(name, v, float32=False):
    """float(v); TypeError unless a real number; ValueError if a float32 option overflows."""
    if not isinstance(v, (numbers.Real, np.floating, np.integer)) or isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number, got {type(v).__name__} {v!r}")
    if float32 and math.isfinite(v) and abs(v) > np.finfo(np.float32).max:
        raise ValueError(f"{name} {v} is out of range (not a 32-bit float)")
    return float(v)


def _int32_row(row, what):
    """One sequence as an int32 numpy array; TypeError unless it holds integers only."""
    if isinstance(row, np.ndarray):
        if row.ndim != 1:
            raise TypeError(f"{what} must be a flat sequence of token ids, got an array of shape {row.shape}")
        if row.dtype.kind not in "iu":
            raise TypeError(f"{what}: token ids must be integers, got a {row.dtype} array")
        lo, hi = (int(row.min()), int(row.max())) if row.size else (0, 0)
    else:
        if not isinstance(row, (list, tuple, range)):
            raise TypeError(f"{what} must be a list of token ids (ints), got {type(row).__name__}")
        for j, v in enumerate(row):
            if not _is_int(v):
                raise TypeError(f"{what}, token {j + 1}: token ids must be integers, got {type(v).__name__} {v!r}")
        lo, hi = (min(row), max(row)) if len(row) else (0, 0)
    if lo < -2**31 or hi >= 2**31:
        raise ValueError(f"{what}: id {lo if lo < -2**31 else hi} is outside the vocabulary (not a 32-bit id)")
    return np.asarray(row, dtype=np.int32)


def _pack(batch, lengths=None, what="batch"):
    """A batch -> (ids int32 [N], offsets int64 [B + 1]), the packed form _native reads.
    batch: a list (tuple) of sequences of ints, or a 2-D integer numpy array; lengths
    (numpy batches only): row i is batch[i, :lengths[i]]."""
    if isinstance(batch, np.ndarray):
        if batch.ndim != 2 or batch.dtype.kind not in "iu":
            raise TypeError(
                f"{what}: a numpy batch must be a 2-D integer array [B, T], got {batch.ndim}-D {batch.dtype}"
                + (" (ragged sequences: pass a list of lists, or a padded 2-D array with lengths=)"
                   if batch.dtype == object else ""))
        B, T = batch.shape
        if B == 0:
            raise ValueError(f"{what}: empty batch (need at least one sequence)")
        if lengths is None:
            rows = [_int32_row(batch[i], f"{what} sequence {i + 1}") for i in range(B)]
        else:
            lens = np.asarray(lengths)
            if lens.ndim != 1 or lens.dtype.kind not in "iu":
                raise TypeError(f"{what}: lengths must be a 1-D sequence of ints, got {lens.dtype} of shape {lens.shape}")
            if lens.shape[0] != B:
                raise ValueError(f"{what}: {lens.shape[0]} lengths for {B} sequences")
            for i, n in enumerate(lens.tolist()):
                if n < 0 or n > T:
                    raise ValueError(f"{what}: lengths[{i}] = {n} is outside [0, {T}] (the array's width)")
            rows = [_int32_row(batch[i, :n], f"{what} sequence {i + 1}") for i, n in enumerate(lens.tolist())]
    else:
        if lengths is not None:
            raise TypeError(f"{what}: lengths= applies to a 2-D numpy batch, not to {type(batch).__name__}")
        if isinstance(batch, (str, bytes)) or not isinstance(batch, (list, tuple)):
            raise TypeError(f"{what} must be a list of token-id lists or a 2-D integer numpy array, "
                            f"got {type(batch).__name__}")
        if len(batch) == 0:
            raise ValueError(f"{what}: empty batch (need at least one sequence)")
        if all(_is_int(v) for v in batch):
            raise TypeError(f"{what} must be a list of sequences (a batch), got a flat list of ints; "
                            f"wrap one sequence as [[...]]")
        rows = [_int32_row(r, f"{what} sequence {i + 1}") for i, r in enumerate(batch)]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    ids = np.concatenate(rows) if rows else np.zeros(0, np.int32)
    return np.ascontiguousarray(ids, dtype=np.int32), offsets


def _find_library(model_dir):
    """DIR/lib<name>.so of a `halformer build` output directory (or that .so itself)."""
    path = pathlib.Path(os.fspath(model_dir))
    if path.is_file() and path.suffix == ".so":
        return path
    if not path.exists():
        raise FileNotFoundError(f"model directory {str(path)!r}: no such directory (make one with halformer.build)")
    if not path.is_dir():
        raise FileNotFoundError(f"{str(path)!r} is neither a model directory nor a model's lib<name>.so")
    libs = sorted(p for p in path.glob("lib*.so") if p.is_file())
    if not libs:
        raise FileNotFoundError(
            f"model directory {str(path)!r} has no lib<name>.so: is it a `halformer build` output directory? "
            "(rebuild the model with this halformer)")
    if len(libs) > 1:
        raise ValueError(f"model directory {str(path)!r} holds several model libraries "
                         f"({', '.join(p.name for p in libs)}): pass the path of one of them")
    return libs[0]


# glibc's dlopen() of a path it has loaded before returns that library, even when the
# file was rebuilt since (`halformer build` replaces it by rename): a rebuilt library is
# loaded from a private copy instead, so build() + Model() in one process see the new model.
_loaded = {}  # realpath -> {(inode, size, mtime): the path dlopen()ed for that version}
_loaded_lock = threading.Lock()
_copies_dir = None


def _loadable(library):
    global _copies_dir
    real = os.path.realpath(library)
    st = os.stat(real)
    version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _loaded_lock:
        versions = _loaded.setdefault(real, {})
        if version not in versions:
            path = real
            if versions:  # another version of this path is loaded
                import atexit
                import shutil
                import tempfile
                if _copies_dir is None:
                    _copies_dir = tempfile.mkdtemp(prefix="halformer-")
                    atexit.register(shutil.rmtree, _copies_dir, True)
                path = os.path.join(_copies_dir, f"{len(versions)}-{os.path.basename(real)}")
                shutil.copyfile(real, path)
            _native.open_library(path)  # ValueError if it is not a model library
            versions[version] = path
        return versions[version]


def _existing_file(what, path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} {path!r}: no such file")
    if os.path.isdir(path):
        raise FileNotFoundError(f"{what} {path!r} is a directory, not a file")
    return path


# ---- models ----------------------------------------------------------------------------

_DONE = object()


class Model:
    """A built model with its weights; see the module docstring."""

    def __init__(self, model_dir, weights, device="cpu", threads=0, tokenizer=None):
        if not isinstance(device, str):
            raise TypeError(f"device must be a str ('cpu', 'cuda', 'opencl'), got {type(device).__name__}")
        threads = _int_arg("threads", threads, 32)
        library = _find_library(model_dir)
        weights = _existing_file("weights", weights)
        self.tokenizer = _text_tokenizer(tokenizer)
        self._m = _native.Model(_loadable(library), weights, device, threads)
        self.library = library
        self.config = self._m.config()

    def _ids(self, batch, what="batch"):
        """Token ids of `batch`: text (a str or a list of str) through the tokenizer, else as is.
        Returns (batch, was_text)."""
        texts = [batch] if isinstance(batch, str) else batch
        if not (isinstance(texts, (list, tuple)) and texts and all(isinstance(t, str) for t in texts)):
            return batch, False
        if self.tokenizer is None:
            hint = "; text needs a tokenizer: halformer.Model(..., tokenizer=tokenizers.Tokenizer or tokenizer.json)"
            if isinstance(batch, str):
                raise TypeError(f"{what} must be a list of token-id lists or a 2-D integer numpy array, got str{hint}")
            raise TypeError(f"{what} sequence 1 must be a list of token ids (ints), got str{hint}")
        return [list(e.ids) for e in self.tokenizer.encode_batch(list(texts))], True

    def _text(self, tokens):
        return [self.tokenizer.decode(list(t), skip_special_tokens=True) for t in tokens]

    device = property(lambda self: self._m.device, doc="the device this model runs on")
    devices = property(lambda self: self._m.devices.split(), doc="the devices the model was built for")
    threads = property(lambda self: self._m.threads, doc="the per-call thread limit (0: every core)")

    def __repr__(self):
        return f"halformer.Model({self.config['name']!r}, device={self.device!r}, library={str(self.library)!r})"

    def encode(self, batch, lengths=None):
        """Encoder output, numpy float32 [B, T, d_model] (T: the longest sequence; rows of
        shorter sequences are unspecified past their length)."""
        return self._m.encode(*_pack(self._ids(batch)[0], lengths))

    def pooled(self, batch, lengths=None):
        """Encoder-only models: the head's vector per sequence, float32 [B, X]."""
        return self._m.pooled(*_pack(self._ids(batch)[0], lengths))

    def score(self, src, tgt=None, src_lengths=None, tgt_lengths=None):
        """Head output float32 [B, T, tgt_vocab]: for teacher-forced decoder inputs `tgt`
        (encoder-decoder; each starts with bos), or over the prompts `src` (decoder-only)."""
        arch = self.config["arch"]
        if arch == "decoder" and tgt is not None:
            raise ValueError("score: tgt applies to encoder-decoder models; a decoder-only model scores src itself")
        if arch == "encoder_decoder" and tgt is None:
            raise ValueError("score: an encoder-decoder model needs tgt (teacher-forced decoder inputs, each "
                             f"starting with bos = {self.config['bos_id']})")
        s = _pack(self._ids(src, "src")[0], src_lengths, "src")
        t = (np.zeros(0, np.int32), np.zeros(1, np.int64)) if tgt is None else \
            _pack(self._ids(tgt, "tgt")[0], tgt_lengths, "tgt")
        return self._m.score(*s, *t)

    def _options(self, max_new_tokens, sampling_topk, sampling_topp, sampling_temperature, seed,
                 repetition_penalty, no_repeat_ngram_size, min_length, return_scores):
        o = _native.GenerationOptions()
        if max_new_tokens is not None:
            n = _int_arg("max_new_tokens", max_new_tokens, 32)
            if n < 1 or n > self.config["max_len"]:
                raise ValueError(f"max_new_tokens {n} is outside [1, max_len = {self.config['max_len']}]")
            o.max_new_tokens = n
        o.sampling_topk = _int_arg("sampling_topk", sampling_topk, 32)
        o.sampling_topp = _float_arg("sampling_topp", sampling_topp, True)
        o.sampling_temperature = _float_arg("sampling_temperature", sampling_temperature, True)
        seed = _int_arg("seed", seed)
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed {seed} is outside [0, 2**64)")
        o.seed = seed
        o.repetition_penalty = _float_arg("repetition_penalty", repetition_penalty, True)
        o.no_repeat_ngram_size = _int_arg("no_repeat_ngram_size", no_repeat_ngram_size, 32)
        o.min_length = _int_arg("min_length", min_length, 32)
        if not isinstance(return_scores, (bool, np.bool_)):
            raise TypeError(f"return_scores must be a bool, got {type(return_scores).__name__}")
        o.return_scores = bool(return_scores)
        _native.validate(o, self.config["tgt_vocab"])  # ValueError naming the option
        return o

    def generate(self, src, max_new_tokens=None, beam_size=1, length_penalty=None, sampling_topk=1,
                 sampling_topp=1.0, sampling_temperature=1.0, seed=0, repetition_penalty=1.0,
                 no_repeat_ngram_size=0, min_length=0, return_scores=False):
        """Generated tokens per source / prompt (see the module docstring); for text in, text
        out (a str for a str, else a list of str; with return_scores, dicts with "text" too)."""
        ids, text = self._ids(src, "src")
        out = self._generate(ids, max_new_tokens, beam_size, length_penalty, sampling_topk, sampling_topp,
                             sampling_temperature, seed, repetition_penalty, no_repeat_ngram_size, min_length,
                             return_scores)
        if not text:
            return out
        if return_scores:
            for d in out:
                d["text"] = self._text([d["tokens"]])[0]
        else:
            out = self._text(out)
        return out[0] if isinstance(src, str) else out

    def _generate(self, src, max_new_tokens, beam_size, length_penalty, sampling_topk, sampling_topp,
                  sampling_temperature, seed, repetition_penalty, no_repeat_ngram_size, min_length, return_scores):
        beam_size = _int_arg("beam_size", beam_size, 32)
        if beam_size < 1:
            raise ValueError(f"generation option beam_size {beam_size} is outside [1, inf)")
        if beam_size > 1 or length_penalty is not None:
            return self._beam(src, max_new_tokens, beam_size, length_penalty, return_scores,
                              dict(sampling_topk=(sampling_topk, 1), sampling_topp=(sampling_topp, 1.0),
                                   sampling_temperature=(sampling_temperature, 1.0), seed=(seed, 0),
                                   repetition_penalty=(repetition_penalty, 1.0),
                                   no_repeat_ngram_size=(no_repeat_ngram_size, 0), min_length=(min_length, 0)))
        o = self._options(max_new_tokens, sampling_topk, sampling_topp, sampling_temperature, seed,
                          repetition_penalty, no_repeat_ngram_size, min_length, return_scores)
        tokens, logprobs = self._m.generate(*_pack(src, None, "src"), o, None)
        if o.return_scores:
            return [{"tokens": t, "log_probs": p} for t, p in zip(tokens, logprobs)]
        return tokens

    def _beam(self, src, max_new_tokens, beam_size, length_penalty, return_scores, others):
        # Beam search takes its size, the length penalty and max_new_tokens only.
        used = [k for k, (v, default) in others.items() if not (type(v) in (int, float) and v == default)]
        if used:
            raise ValueError(f"beam_size {beam_size}: beam search takes length_penalty and max_new_tokens; "
                             f"{', '.join(used)} apply to greedy decoding / sampling (beam_size=1)")
        if beam_size == 1:
            raise ValueError("length_penalty applies to beam search (beam_size > 1)")
        if self.config["arch"] != "encoder_decoder":
            raise ValueError(f"beam search needs an encoder-decoder model; {self.config['name']} is "
                             f"{self.config['arch']}")
        lp = self.config["length_penalty"] if length_penalty is None else _float_arg("length_penalty", length_penalty)
        if not math.isfinite(lp):
            raise ValueError(f"length_penalty {lp} is not finite")
        n = self.config["max_new_tokens"] if max_new_tokens is None else _int_arg("max_new_tokens", max_new_tokens)
        if n < 1 or n > self.config["max_len"]:
            raise ValueError(f"max_new_tokens {n} is outside [1, max_len = {self.config['max_len']}]")
        if not isinstance(return_scores, (bool, np.bool_)):
            raise TypeError(f"return_scores must be a bool, got {type(return_scores).__name__}")
        hyps, scores = self._m.beam_search(*_pack(src, None, "src"), beam_size, lp, n)
        if return_scores:
            return [{"tokens": h[0] if h else [], "score": s[0] if s else -math.inf} for h, s in zip(hyps, scores)]
        return [h[0] if h else [] for h in hyps]

    def generate_iter(self, src, max_new_tokens=None, sampling_topk=1, sampling_topp=1.0,
                      sampling_temperature=1.0, seed=0, repetition_penalty=1.0, no_repeat_ngram_size=0,
                      min_length=0, return_scores=False):
        """Yields (row, token) for every token as soon as it is chosen (tokens of a row in
        order; eos included); the same tokens as generate() with the same options. With
        return_scores, (row, token, log_prob): generate(return_scores=True)'s log_probs.
        Generation runs in a background thread, started by this call, which returns once
        the first token is there, so that bad inputs raise here rather than at the first
        next(). Closing the iterator early stops generation after each row's next token."""
        o = self._options(max_new_tokens, sampling_topk, sampling_topp, sampling_temperature, seed,
                          repetition_penalty, no_repeat_ngram_size, min_length, return_scores)
        packed = _pack(self._ids(src, "src")[0], None, "src")
        q, stop, failure = queue.SimpleQueue(), threading.Event(), []

        def on_token(*item):  # (row, token), or (row, token, log_prob) with return_scores
            q.put(item)
            return not stop.is_set()

        def work():
            try:
                self._m.generate(*packed, o, on_token)
            except BaseException as e:  # re-raised in the consumer
                failure.append(e)
            finally:
                q.put(_DONE)

        # not a daemon: interpreter exit waits for it (bounded by max_new_tokens) rather than
        # killing it while it is inside the runtime
        worker = threading.Thread(target=work, name="halformer-generate")
        worker.start()
        first = q.get()
        if first is _DONE:
            worker.join()
            if failure:
                raise failure[0]
        return self._stream(first, q, stop, failure, worker)

    @staticmethod
    def _stream(item, q, stop, failure, worker):
        try:
            while item is not _DONE:
                yield item
                item = q.get()
        finally:
            stop.set()
            worker.join()
        if failure:
            raise failure[0]


def _text_tokenizer(tokenizer):
    """A tokenizers.Tokenizer (or anything with encode_batch / decode), or one loaded from a
    tokenizer.json path; None stays None."""
    if tokenizer is None:
        return None
    if isinstance(tokenizer, (str, os.PathLike)):
        path = _existing_file("tokenizer", tokenizer)
        try:
            import tokenizers
        except ImportError as e:
            raise ImportError(f"tokenizer={str(path)!r} needs the Hugging Face `tokenizers` package ({e})") from None
        try:
            return tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the library's own message: not a tokenizer.json
            raise ValueError(f"tokenizer {str(path)!r} is not a tokenizers JSON file: {e}") from None
    if not (callable(getattr(tokenizer, "encode_batch", None)) and callable(getattr(tokenizer, "decode", None))):
        raise TypeError(f"tokenizer must be a tokenizers.Tokenizer or the path of a tokenizer.json, got "
                        f"{type(tokenizer).__name__}")
    return tokenizer


# ---- sentence embeddings -----------------------------------------------------------------

class SentenceEmbedder:
    """Sentence embeddings from text with a built encoder-only model (head: embedding),
    e.g. all-MiniLM-L6-v2: the C++ BertTokenizer + Model.pooled, with
    sentence-transformers 2.2.2's encode() semantics.

    max_seq_length (tokens per text with [CLS] and [SEP]; longer texts are truncated):
    default, sentence_bert_config.json's max_seq_length when that file lies next to the
    weights (256 for all-MiniLM-L6-v2), else the model's max_len."""

    def __init__(self, model_dir, weights, vocab, max_seq_length=None, device="cpu", threads=0):
        vocab = _existing_file("vocabulary", vocab)
        self.model = Model(model_dir, weights, device=device, threads=threads)
        cfg = self.model.config
        if cfg["arch"] != "encoder" or cfg["head"] != "embedding":
            raise ValueError(f"SentenceEmbedder needs an encoder model with an embedding head; "
                             f"{cfg['name']} is {cfg['arch']} with head {cfg['head']}")
        self.tokenizer = BertTokenizer.from_vocab_file(vocab)
        if self.tokenizer.vocab_size > cfg["src_vocab"]:
            raise ValueError(f"vocabulary {vocab!r}: {self.tokenizer.vocab_size} tokens, more than the model's "
                             f"vocabulary of {cfg['src_vocab']} (is it this model's vocab.txt?)")
        if max_seq_length is None:
            st_config = os.path.join(os.path.dirname(os.path.abspath(os.fspath(weights))), "sentence_bert_config.json")
            if os.path.isfile(st_config):
                import json
                with open(st_config, encoding="utf-8") as f:
                    max_seq_length = json.load(f).get("max_seq_length")
            if max_seq_length is None:
                max_seq_length = cfg["max_len"]
        max_seq_length = _int_arg("max_seq_length", max_seq_length)
        if not 2 <= max_seq_length <= cfg["max_len"]:
            raise ValueError(f"max_seq_length {max_seq_length} is outside [2, {cfg['max_len']}] "
                             f"(2: [CLS] and [SEP]; the model's max_len is {cfg['max_len']})")
        self.max_seq_length = max_seq_length

    def encode(self, sentences, batch_size=32, show_progress_bar=None, convert_to_numpy=True,
               normalize_embeddings=False):
        """SentenceTransformer.encode (2.2.2): one str -> one embedding [d]; a list ->
        [N, d] numpy (convert_to_numpy) or a list of N 1-D arrays. Texts are sorted by
        length (longest first) into batches of batch_size, the results put back in input
        order. normalize_embeddings: L2-normalise each. show_progress_bar: a tqdm bar
        over the batches (None: when this module's logger is at INFO or DEBUG)."""
        if show_progress_bar is None:
            show_progress_bar = logger.getEffectiveLevel() in (logging.INFO, logging.DEBUG)
        batch_size = _int_arg("batch_size", batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be >= 1")
        input_was_string = False
        if isinstance(sentences, str) or not hasattr(sentences, "__len__"):
            sentences = [sentences]
            input_was_string = True
        for i, s in enumerate(sentences):
            if not isinstance(s, str):
                raise TypeError(f"sentences[{i}] must be a str, got {type(s).__name__}")
        # sentence-transformers' order: np.argsort of -len (quicksort, as it does).
        length_sorted_idx = np.argsort([-len(s) for s in sentences])
        sentences_sorted = [sentences[i] for i in length_sorted_idx]
        starts = range(0, len(sentences), batch_size)
        if show_progress_bar:
            from tqdm.autonotebook import trange
            starts = trange(0, len(sentences), batch_size, desc="Batches")
        all_embeddings = []
        for start in starts:
            texts = [s.strip() for s in sentences_sorted[start:start + batch_size]]  # as its Transformer does
            emb = self.model.pooled(self.tokenizer.encode_batch(texts, self.max_seq_length))
            if normalize_embeddings:  # torch.nn.functional.normalize(p=2, eps=1e-12)
                emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), np.float32(1e-12))
            all_embeddings.extend(emb)
        all_embeddings = [all_embeddings[i] for i in np.argsort(length_sorted_idx)]
        if convert_to_numpy:
            all_embeddings = np.asarray(all_embeddings)
        if input_was_string:
            all_embeddings = all_embeddings[0]
        return all_embeddings
