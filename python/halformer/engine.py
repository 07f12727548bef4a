"""halformer.Engine: continuous batching for decoders (docs/engine.md).

    model = halformer.Model("out/gpt-tiny", weights="w.safetensors")
    with halformer.Engine(model, max_sequences=8) as engine:
        for token in engine.submit([5, 9, 13], max_new_tokens=16):   # from any thread
            ...
        async for token in engine.submit_async([5, 9, 13]):          # in a coroutine
            ...

Requests join the running batch at the engine's next step and leave it as they end; a
request's tokens are those of model.generate([prompt], same options) on it alone (an
encoder-decoder's prompt is its source)
(the runtime's Engine, halformer/engine.h). One background thread steps the engine while
any request waits or runs; submit() may be called from any thread."""

import asyncio
import atexit
import queue
import threading
import time
import weakref

from . import _native
from .checks import _float_arg, _int_arg, _int32_row

_END = object()


class Stream:
    """The tokens of one request, in order, as they are chosen (an iterator; eos included
    when chosen). finish_reason is "eos", "length", "stop" or "cancelled" once it ended;
    token_times holds each token's time.perf_counter() when the engine chose it (time to
    first token, time per token, whenever the consumer reads them); logprobs each token's
    log-probability (model.generate's scores; NaN unless submitted with return_scores).
    Closing it (or cancel()) ends the request at the engine's next step."""

    def __init__(self, engine, request_id, loop=None):
        self._engine, self.id, self._loop = engine, request_id, loop
        self._q = asyncio.Queue() if loop else queue.SimpleQueue()
        self.finish_reason = None
        self.token_times = []
        self.logprobs = []
        self._error = None

    def _put(self, item, logprob=float("nan")):  # from the engine's thread
        if item is not _END:
            self.token_times.append(time.perf_counter())
            self.logprobs.append(logprob)
        if self._loop:
            try:
                self._loop.call_soon_threadsafe(self._q.put_nowait, item)
            except RuntimeError:  # its event loop is closed: nobody is left to read it
                pass
        else:
            self._q.put(item)

    def _item(self, item):
        if item is _END:
            if self._error is not None:
                raise self._error
            raise StopIteration
        return item

    def __iter__(self):
        return self

    def __next__(self):
        if self._loop:
            raise TypeError("a stream from submit_async() is iterated with `async for`")
        return self._item(self._q.get())

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return self._item(await self._q.get())
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self):
        self._engine._cancel(self.id)

    close = cancel


class Engine:
    """Continuous batching over `model` (a decoder-only or encoder-decoder halformer.Model):
    at most
    max_sequences sequences decoded together, each of at most max_len positions (None: the
    model's max_len), their keys and values in a paged cache of kv_cache_mb MiB (None: room
    for max_sequences of max_len; a full pool preempts the newest sequence, which is
    recomputed later), at most prefill_tokens prompt tokens prefilled per step (a long
    prompt in pieces)."""

    def __init__(self, model, max_sequences=8, max_len=None, prefill_tokens=512, kv_cache_mb=None):
        from .model import Model
        if not isinstance(model, Model):
            raise TypeError(f"model must be a halformer.Model, got {type(model).__name__}")
        self.model = model
        self._native = _native.Engine(model._m, _int_arg("max_sequences", max_sequences, 32),
                                      0 if max_len is None else _int_arg("max_len", max_len, 32),
                                      _int_arg("prefill_tokens", prefill_tokens, 32),
                                      0.0 if kv_cache_mb is None else _float_arg("kv_cache_mb", kv_cache_mb))
        # _lock: the streams and the engine thread's sleep; held briefly, never across a
        # step, so submit() (and an asyncio caller's event loop) does not wait for one.
        # _stepping: held across a native step; what reads the native engine's state takes it.
        self._lock = threading.Condition()
        self._stepping = threading.Lock()
        self._streams = {}
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="halformer-engine", daemon=True)
        self._thread.start()
        _open_engines.add(self)

    max_len = property(lambda self: self._native.max_len, doc="positions per sequence, prompt + new tokens")

    @property
    def running(self):
        """Sequences being decoded."""
        with self._stepping:
            return self._native.running

    @property
    def waiting(self):
        """Requests queued for a slot."""
        with self._stepping:
            return self._native.waiting

    def stats(self):
        """The paged cache: blocks, blocks_in_use, blocks_cached (prompt blocks a later prompt
        may share), block_bytes, and counts of preemptions and prefix_tokens (prompt tokens
        not computed: shared)."""
        with self._stepping:
            return dict(self._native.stats())

    def submit(self, prompt, max_new_tokens=None, sampling_topk=1, sampling_topp=1.0, sampling_temperature=1.0,
               seed=0, repetition_penalty=1.0, no_repeat_ngram_size=0, min_length=0, stop=None, return_scores=False,
               _loop=None):
        """Queues one prompt (token ids, or text with the model's tokenizer) and returns its
        Stream of token ids. The options are model.generate()'s (return_scores: each token's
        log-probability in Stream.logprobs); stop: token-id sequences that end the request
        when its new tokens end with one. Bad input raises here."""
        ids, _ = self.model._ids(prompt, "prompt")
        row = _int32_row(ids[0] if isinstance(prompt, str) else ids, "prompt")
        o = self.model._options(max_new_tokens, sampling_topk, sampling_topp, sampling_temperature, seed,
                                repetition_penalty, no_repeat_ngram_size, min_length, return_scores)
        if stop is None:
            stop = []
        if not isinstance(stop, (list, tuple)):
            raise TypeError(f"stop must be a list of token-id lists, got {type(stop).__name__}")
        stops = [_int32_row(s, f"stop sequence {i + 1}") for i, s in enumerate(stop)]
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            request_id = self._native.submit(row.tolist(), o, [s.tolist() for s in stops])  # ValueError naming it
            stream = self._streams[request_id] = Stream(self, request_id, _loop)
            self._lock.notify()
        return stream

    def submit_async(self, prompt, **options):
        """submit() for a coroutine: the Stream is iterated with `async for`."""
        return self.submit(prompt, _loop=asyncio.get_running_loop(), **options)

    def _cancel(self, request_id):
        with self._lock:
            if not self._closed:
                self._native.cancel(request_id)
                self._lock.notify()

    def _loop(self):
        while True:
            with self._lock:
                while not self._closed and self._idle():
                    self._lock.wait()
                if self._closed:
                    return
            # The step in its two halves: the first tokens of newly prefilled requests
            # reach their streams before the decode pass runs. A request submitted during a
            # half joins at the next admission; its stream is registered before its first
            # event can be delivered (submit() registers it under _lock, before which the
            # native engine cannot have it).
            for half in (1, 2):
                try:
                    with self._stepping:
                        events = self._native.step(half)
                except Exception as e:  # a step failed: every request in it ends with the error
                    with self._lock:
                        for s in self._streams.values():
                            s._error = e
                            s._put(_END)
                        self._streams.clear()
                    break
                with self._lock:
                    self._deliver(events)

    def _idle(self):
        with self._stepping:
            return self._native.idle

    def _deliver(self, events):
        ended = []
        for request_id, token, finished, reason, logprob in events:
            s = self._streams.get(request_id)
            if s is None:
                continue
            if token >= 0:
                s._put(token, logprob)
            if finished:
                s.finish_reason = reason
                ended.append(request_id)
        for request_id in ended:
            self._streams.pop(request_id)._put(_END)

    def close(self):
        """Ends every request ("cancelled") and stops the engine's thread."""
        with self._lock:
            self._closed = True
            for s in self._streams.values():
                s.finish_reason = "cancelled"
                s._put(_END)
            self._streams.clear()
            self._lock.notify()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# Engines not closed by their owner are closed at exit: a daemon thread still inside a
# native step when the interpreter finalizes would end the process with std::terminate.
_open_engines = weakref.WeakSet()


@atexit.register
def _close_open_engines():
    for engine in list(_open_engines):
        try:
            engine.close()
        except Exception:  # noqa: BLE001 -- every other engine is still closed
            pass
