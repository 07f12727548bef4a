"""Not a test: MiniLM (embed_text) throughput and latency through halformer.serve for a few
batching settings, and the Python API called directly at batch 16, for docs/serving.md.

    PYTHONPATH=build/python .venv/bin/python tests/serving/bench_batching.py [CLIENTS] [REQUESTS]"""
import os
import sys
import tempfile
import threading
import time

import numpy as np
import tritonclient.grpc as tg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import halformer  # noqa: E402
from conftest import MINILM_DIR, Server, minilm_files, write_config  # noqa: E402
from test_load import sentence  # noqa: E402

CLIENTS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
REQUESTS = int(sys.argv[2]) if len(sys.argv) > 2 else 100
THREADS = int(os.environ.get("THREADS", 2))
SETTINGS = [(1, 0), (16, 0), (16, 1000), (16, 5000), (32, 1000)]
texts = [sentence(k) for k in range(64)]


def load(server):
    lat, lock = [], threading.Lock()

    def client(c):
        cl = tg.InferenceServerClient(server.grpc)
        for k in range(REQUESTS):
            i = tg.InferInput("TEXT", [1, 1], "BYTES")
            i.set_data_from_numpy(np.array([[texts[(c * REQUESTS + k) % 64].encode()]], dtype=object))
            t0 = time.perf_counter()
            cl.infer("minilm", [i])
            with lock:
                lat.append(time.perf_counter() - t0)

    ts = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    t0 = time.perf_counter()
    [t.start() for t in ts]
    [t.join() for t in ts]
    wall = time.perf_counter() - t0
    lat = np.asarray(lat) * 1000
    return len(lat) / wall, np.percentile(lat, 50), np.percentile(lat, 99)


w, v = minilm_files()
e = halformer.SentenceEmbedder(MINILM_DIR, w, v, threads=THREADS)
e.encode(texts[:16], batch_size=16)
t0 = time.perf_counter()
for r in range(8):
    e.encode(texts, batch_size=16)
print(f"Python API, batch 16, threads {THREADS}: {8 * len(texts) / (time.perf_counter() - t0):.1f} sentences/s", flush=True)
del e
print(f"| max_batch_size | max_queue_delay_us | req/s | p50 ms | p99 ms |  ({CLIENTS} gRPC clients x {REQUESTS}, threads {THREADS})")
print("|---|---|---|---|---|")
for mb, delay in SETTINGS:
    d = tempfile.mkdtemp()
    s = Server(write_config(os.path.join(d, "c.yaml"), delay_us=delay, max_batch=mb, threads=THREADS), d)
    try:
        s.wait_ready(["minilm"])
        rps, p50, p99 = load(s)
        print(f"| {mb} | {delay} | {rps:.1f} | {p50:.1f} | {p99:.1f} |", flush=True)
    finally:
        s.kill()
