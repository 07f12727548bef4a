"""halformer.Engine (python/halformer/engine.py; docs/engine.md): requests submitted from
several threads and from a coroutine, while others run, get the tokens model.generate
gives each prompt alone (greedy and seeded sampling), also in a key/value pool so small
that sequences are preempted; cancelling and closing end streams and free their blocks;
bad arguments raise by name."""
import asyncio
import subprocess
import sys
import threading

import pytest

import halformer


def _jobs():
    jobs = []
    for j in range(10):
        prompt = [3 + (17 * j + 5 * i) % 500 for i in range(1 + (7 * j) % 19)]
        opts = dict(max_new_tokens=1 + (5 * j) % 12)
        if j % 2:
            opts.update(sampling_topk=0 if j % 3 == 0 else 20, sampling_temperature=0.8, seed=100 + j)
        jobs.append((prompt, opts))
    return jobs


def _from_threads(engine, jobs):
    """Each (prompt, options) job submitted from its own thread, all at once: their tokens."""
    got = [None] * len(jobs)

    def run(i):
        got[i] = list(engine.submit(jobs[i][0], **jobs[i][1]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_threads_get_their_alone_tokens(gpt_tiny):
    model = gpt_tiny.model()
    jobs = _jobs()
    want = [model.generate([p], **o)[0] for p, o in jobs]
    with halformer.Engine(model, max_sequences=3, prefill_tokens=16) as engine:
        got = _from_threads(engine, jobs)
    assert got == want


def test_small_pool_preempts_and_frees(gpt_tiny):
    model = gpt_tiny.model()
    jobs = _jobs()
    want = [model.generate([p], **o)[0] for p, o in jobs]
    with halformer.Engine(model, max_sequences=8) as probe:
        block = probe.stats()["block_bytes"]
    with halformer.Engine(model, max_sequences=8, kv_cache_mb=4.5 * block / 2**20) as engine:
        assert engine.stats()["blocks"] == 4
        with engine._lock:  # all queued before the first step: they outgrow the pool together
            streams = [engine.submit(p, **o) for p, o in jobs]
        got = [list(s) for s in streams]
        stats = engine.stats()
        # A client that leaves mid-stream: its request ends and its blocks go back.
        s = engine.submit([5, 9, 13], max_new_tokens=40)
        next(s)
        s.close()
        list(s)
        after = engine.stats()
    assert got == want
    assert stats["preemptions"] > 0 and stats["blocks_in_use"] == 0
    assert after["blocks_in_use"] == 0


def test_int8_cache_engine_and_batch_equal_alone(gpt_tied_kv8):
    """An int8 key/value cache (docs/precision.md#int8-key-value-cache): the engine's paged
    pool, a batch of prompts and a prompt alone all attend over the same quantized rows, so
    the engine and a batch give each prompt's tokens alone (greedy and seeded sampling)."""
    model = gpt_tied_kv8.model()
    jobs = [([3 + t % 33 for t in p], o) for p, o in _jobs()]  # gpt-tied's vocabulary is 37 tokens
    want = [model.generate([p], **o)[0] for p, o in jobs]
    with halformer.Engine(model, max_sequences=3, prefill_tokens=8) as engine:
        # int8 rows: 2 layers x 16 positions x 6 key and value heads of 20 bytes and a 4-byte
        # scale (bf16 would take 2 x 16 x 120 x 2 = 7680 bytes a block)
        assert engine.stats()["block_bytes"] == 2 * 16 * 6 * (20 + 4)
        assert _from_threads(engine, jobs) == want
    greedy = [p for p, o in jobs if "seed" not in o]
    assert model.generate(greedy, max_new_tokens=10) == [model.generate([p], max_new_tokens=10)[0] for p in greedy]


def test_scores_equal_generate(gpt_tiny):
    model = gpt_tiny.model()
    want = model.generate([[5, 9, 13]], max_new_tokens=8, return_scores=True)[0]
    with halformer.Engine(model) as engine:
        s = engine.submit([5, 9, 13], max_new_tokens=8, return_scores=True)
        assert list(s) == want["tokens"]
        assert s.logprobs == want["log_probs"]  # the same chooser on the same bits


def test_async_streams(gpt_tiny):
    model = gpt_tiny.model()
    jobs = _jobs()[:6]
    want = [model.generate([p], **o)[0] for p, o in jobs]

    async def main(engine):
        async def one(p, o):
            return [t async for t in engine.submit_async(p, **o)]
        return await asyncio.gather(*(one(p, o) for p, o in jobs))

    with halformer.Engine(model, max_sequences=2) as engine:
        assert asyncio.run(main(engine)) == want


def test_stop_cancel_close(gpt_tiny):
    model = gpt_tiny.model()
    alone = model.generate([[5, 9, 13]], max_new_tokens=10)[0]
    engine = halformer.Engine(model, max_sequences=1)
    s = engine.submit([5, 9, 13], max_new_tokens=10, stop=[alone[2:4]])
    assert list(s) == alone[:4] and s.finish_reason == "stop"
    # A waiting request cancelled: the engine's lock keeps it from stepping meanwhile (one slot, taken).
    with engine._lock:
        long = engine.submit([7, 8], max_new_tokens=100)
        queued = engine.submit([9], max_new_tokens=100)
        queued.cancel()
    assert list(queued) == [] and queued.finish_reason == "cancelled"
    # A running request cancelled after its first token: it ends early, unless it had all
    # 100 tokens already (gpt-tiny is fast); either way its stream ends.
    next(long)
    long.cancel()
    rest = list(long)
    assert long.finish_reason in ("cancelled", "length")
    assert (long.finish_reason == "cancelled") == (1 + len(rest) < 100)
    last = engine.submit([4], max_new_tokens=100)
    engine.close()
    list(last)
    assert last.finish_reason in ("cancelled", "length")
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit([4])


def test_encoder_decoder_requests_get_their_alone_tokens(reverse_tiny):
    """reverse-tiny (trained to reverse its source): sources from several threads, greedy and
    seeded sampling, equal model.generate on each alone; the greedy ones are reversals."""
    model = reverse_tiny.model()
    jobs = []
    for j in range(8):
        source = [1 + (5 * j + 3 * i) % 13 for i in range(2 + j % 6)]
        opts = dict(max_new_tokens=12)
        if j % 2:
            opts.update(sampling_topk=5, sampling_temperature=0.9, seed=40 + j)
        jobs.append((source, opts))
    want = [model.generate([p], **o)[0] for p, o in jobs]
    assert want[0] == jobs[0][0][::-1] + [model.config["eos_id"]]
    with halformer.Engine(model, max_sequences=3) as engine:
        got = _from_threads(engine, jobs)
        assert engine.stats()["blocks_in_use"] == 0
    assert got == want


def test_relative_positions_get_their_alone_tokens():
    """The imported T5 (random weights; relative position biases, which place a query at its
    last key): rows at different positions in one decode pass equal model.generate alone,
    tokens and log-probabilities."""
    from conftest import BUILD
    model = halformer.Model(BUILD / "import" / "t5" / "model", weights=BUILD / "import" / "hf" / "t5" / "model.safetensors")
    assert model.config["positions"] == "relative"
    jobs = []
    for j in range(8):
        opts = dict(max_new_tokens=20, min_length=20 if j % 2 else 0)
        if j % 3 == 1:
            opts.update(sampling_topk=10, sampling_temperature=0.9, seed=j)
        jobs.append(([5 + (7 * j + 3 * i) % 90 for i in range(3 + j % 7)], opts))
    want = [model.generate([p], return_scores=True, **o)[0] for p, o in jobs]
    with halformer.Engine(model, max_sequences=3) as engine:
        with engine._lock:  # all queued before the first step: rows at different positions
            streams = [engine.submit(p, return_scores=True, **o) for p, o in jobs]
        got = [list(s) for s in streams]
    assert got == [w["tokens"] for w in want]
    # The log-probabilities too, bit for bit (the tokens alone could hide a shifted bias).
    assert [s.logprobs for s in streams] == [w["log_probs"] for w in want]


def test_bad_arguments(gpt_tiny, reverse_tiny, bert_classifier):
    model = gpt_tiny.model()
    with halformer.Engine(model) as engine:
        with pytest.raises(ValueError, match="vocabulary"):
            engine.submit([5, 100000])
        with pytest.raises(ValueError, match="empty"):
            engine.submit([])
        with pytest.raises(ValueError, match="max_len"):
            engine.submit(list(range(3, 103)), max_new_tokens=100)
        with pytest.raises(TypeError, match="token ids"):
            engine.submit([5, "x"])
        with pytest.raises(TypeError, match="stop"):
            engine.submit([5], stop=7)
        with pytest.raises(ValueError, match="sampling_topp"):
            engine.submit([5], sampling_topp=2.0)
    with pytest.raises(ValueError, match="kv_cache_mb"):
        halformer.Engine(model, kv_cache_mb=-1)
    with pytest.raises(TypeError, match="kv_cache_mb"):
        halformer.Engine(model, kv_cache_mb="1G")
    with pytest.raises(ValueError, match="max_sequences 0"):
        halformer.Engine(model, max_sequences=0)
    with pytest.raises(TypeError, match="halformer.Model"):
        halformer.Engine("gpt-tiny")
    with pytest.raises(ValueError, match="needs a decoder"):
        halformer.Engine(bert_classifier.model())
    with halformer.Engine(reverse_tiny.model()) as engine:
        with pytest.raises(ValueError, match="source"):
            engine.submit([3, 16])


def test_exit_with_an_engine_left_open(gpt_tiny):
    """A script that leaves a stream mid-way and never closes its engine exits cleanly (a
    daemon thread inside a native step at finalization would std::terminate)."""
    script = f"""
import halformer
model = halformer.Model({str(gpt_tiny.dir)!r}, weights={gpt_tiny.weights!r})
engine = halformer.Engine(model, max_sequences=2)
for i in range(4):
    engine.submit([5 + i] * 40, max_new_tokens=80)
for token in engine.submit([7, 8, 9], max_new_tokens=100):
    break
print("left")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "left" in r.stdout and "terminate" not in r.stderr, r.stdout + r.stderr
