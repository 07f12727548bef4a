"""halformer.Model: a built model with its weights, over halformer._native (encode, pooled,
score, generate, generate_iter), and the Hugging Face tokenizer that lets it take and
return text. The API reference is the package docstring (halformer/__init__.py)."""
import math
import os
import queue
import threading

import numpy as np

from . import _native
from .checks import _existing_file, _float_arg, _int_arg, _pack
from .library import _find_library, _loadable

_DONE = object()


class Model:
    """A built model with its weights; see the package docstring (halformer/__init__.py)."""

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
        """Generated tokens per source / prompt (see the package docstring); for text in, text
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
