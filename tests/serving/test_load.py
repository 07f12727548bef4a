"""A bounded load run against all-MiniLM-L6-v2 (embed_text) with the default batching
settings: 8 concurrent gRPC/HTTP clients x 250 requests, every request id answered exactly
once, zero errors, every embedding equal to the Python API's; prints throughput, p50/p99."""
import os
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th

import halformer
from conftest import MINILM_DIR, minilm_files

CLIENTS = int(os.environ.get("HALFORMER_LOAD_CLIENTS", 8))
PER_CLIENT = int(os.environ.get("HALFORMER_LOAD_REQUESTS", 250))
WORDS = "the a man woman is eating food meal stock market fell rose quickly slowly today in city".split()


def sentence(k):
    rng = np.random.default_rng(k)
    return " ".join(rng.choice(WORDS, size=int(rng.integers(3, 16))))


def test_load_minilm(server_factory):
    server = server_factory(delay_us=1000, max_batch=16)  # the defaults of docs/serving.md
    texts = [sentence(k) for k in range(64)]
    w, v = minilm_files()
    emb = halformer.SentenceEmbedder(MINILM_DIR, w, v, threads=1)
    want = [emb.encode([t])[0] for t in texts]

    answered, errors, latencies = {}, [], []
    lock = threading.Lock()

    def client(c):
        grpc = c % 2 == 0  # half the clients speak gRPC, half HTTP
        mod = tg if grpc else th
        cl = tg.InferenceServerClient(server.grpc) if grpc else th.InferenceServerClient(server.http)
        for k in range(PER_CLIENT):
            rid = f"c{c}-r{k}"
            t = texts[(c * PER_CLIENT + k) % len(texts)]
            i = mod.InferInput("TEXT", [1, 1], "BYTES")
            i.set_data_from_numpy(np.array([[t.encode()]], dtype=object))
            t0 = time.perf_counter()
            try:
                r = cl.infer("minilm", [i], request_id=rid)
                dt = time.perf_counter() - t0
                got_id = r.get_response().id if grpc else r.get_response()["id"]
                ok = np.array_equal(r.as_numpy("EMBEDDING")[0], want[(c * PER_CLIENT + k) % len(texts)])
                with lock:
                    latencies.append(dt)
                    answered[got_id] = answered.get(got_id, 0) + 1
                    if not ok:
                        errors.append(f"{rid}: embedding differs from the Python API")
            except Exception as e:  # counted, reported below
                with lock:
                    errors.append(f"{rid}: {e}")
        cl.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    wall = time.perf_counter() - t0
    assert not any(t.is_alive() for t in threads), "clients still running after 300 s"
    n = CLIENTS * PER_CLIENT
    lat = np.sort(np.asarray(latencies)) * 1000
    print(f"\nload: {CLIENTS} clients x {PER_CLIENT} requests = {n} in {wall:.2f} s: {n / wall:.1f} req/s, "
          f"p50 {np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms, errors {len(errors)}")
    assert errors == [], errors[:5]
    expected = {f"c{c}-r{k}" for c in range(CLIENTS) for k in range(PER_CLIENT)}
    assert set(answered) == expected and all(v == 1 for v in answered.values())
