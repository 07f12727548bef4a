"""The issue's bounded load against all-MiniLM-L6-v2 (embed_text): 32 concurrent clients
(half gRPC, half HTTP) send 5,000 requests, once with the default dynamic batching and
once with batching off (max_batch_size 1); each run must answer every request id exactly
once, with zero errors and every embedding equal to the Python API's. Prints throughput
and p50/p99 for both (HALFORMER_LOAD_CLIENTS / HALFORMER_LOAD_REQUESTS change the size)."""
import os
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th

import halformer
from conftest import MINILM_DIR, minilm_files

CLIENTS = int(os.environ.get("HALFORMER_LOAD_CLIENTS", 32))
REQUESTS = int(os.environ.get("HALFORMER_LOAD_REQUESTS", 5000))  # in all, spread over the clients
WORDS = "the a man woman is eating food meal stock market fell rose quickly slowly today in city".split()


def sentence(k):
    rng = np.random.default_rng(k)
    return " ".join(rng.choice(WORDS, size=int(rng.integers(3, 16))))


@pytest.mark.parametrize("batching,delay_us,max_batch", [("on", 1000, 32), ("off", 0, 1)])  # on: docs/serving.md's defaults
def test_load_minilm(server_factory, batching, delay_us, max_batch):
    server = server_factory(delay_us=delay_us, max_batch=max_batch)
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
        for k in range(c, REQUESTS, CLIENTS):  # request k goes to client k % CLIENTS
            rid = f"r{k}"
            i = mod.InferInput("TEXT", [1, 1], "BYTES")
            i.set_data_from_numpy(np.array([[texts[k % len(texts)].encode()]], dtype=object))
            t0 = time.perf_counter()
            try:
                r = cl.infer("minilm", [i], request_id=rid)
                dt = time.perf_counter() - t0
                got_id = r.get_response().id if grpc else r.get_response()["id"]
                ok = np.array_equal(r.as_numpy("EMBEDDING")[0], want[k % len(texts)])
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
        t.join(timeout=600)
    wall = time.perf_counter() - t0
    assert not any(t.is_alive() for t in threads), "clients still running after 600 s"
    lat = np.sort(np.asarray(latencies)) * 1000
    print(f"\nload, batching {batching} (max_batch_size {max_batch}, max_queue_delay {delay_us} us): {CLIENTS} clients, "
          f"{REQUESTS} requests in {wall:.2f} s: {REQUESTS / wall:.1f} req/s, p50 {np.percentile(lat, 50):.1f} ms, "
          f"p99 {np.percentile(lat, 99):.1f} ms, errors {len(errors)}, answered {len(answered)} ids")
    assert errors == [], errors[:5]
    lost = REQUESTS - len(answered)
    repeated = [i for i, n in answered.items() if n != 1]
    assert set(answered) == {f"r{k}" for k in range(REQUESTS)}, f"{lost} ids never answered"
    assert not repeated, f"answered more than once: {repeated[:5]}"
