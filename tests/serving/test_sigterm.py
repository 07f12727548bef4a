"""SIGTERM with requests in flight: they all complete, then the server exits 0."""
import signal
import threading
import time
import urllib.request

import numpy as np
import tritonclient.http as th

LONG = " ".join(["serving"] * 300)  # 256 tokens after truncation: each request takes a while


def metrics(server):
    """Triton's Prometheus counters for model minilm."""
    text = urllib.request.urlopen(f"http://localhost:{server.metrics_port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("nv_inference") and 'model="minilm"' in line:
            out[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_sigterm_lets_in_flight_requests_finish(server_factory):
    server = server_factory(delay_us=1000, max_batch=4)
    n, executing = 48, 2 * 4  # 2 model instances (the default), each a batch of <= 4
    results, started, lock = {}, threading.Barrier(n + 1), threading.Lock()

    def client(k):
        c = th.InferenceServerClient(server.http, network_timeout=120)
        i = th.InferInput("TEXT", [1, 1], "BYTES")
        i.set_data_from_numpy(np.array([[LONG.encode()]], dtype=object))
        started.wait()
        try:
            r = c.infer("minilm", [i], request_id=str(k))
            out = ("ok", r.as_numpy("EMBEDDING").shape, time.monotonic())
        except Exception as e:
            out = ("error", str(e), time.monotonic())
        with lock:
            results[k] = out

    threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    started.wait()
    # until Triton has every request (queued, done, or in one of the batches executing)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        m = metrics(server)
        if m.get("nv_inference_pending_request_count", 0) + m.get("nv_inference_request_success", 0) >= n - executing:
            break
        time.sleep(0.02)
    time.sleep(0.05)  # the executing batches may hide a straggler still on its way in
    with lock:
        done_before = len(results)
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=120)
    code = server.proc.wait(timeout=120)
    print(f"\nSIGTERM after {done_before}/{n} answered; after it: "
          f"{sum(1 for r in results.values() if r[2] > sent)} more answered; exit code {code}")
    assert sorted(results) == list(range(n))
    assert all(r[0] == "ok" and r[1] == (1, 384) for r in results.values()), results
    assert any(r[2] > sent for r in results.values()), "no request was in flight at SIGTERM"
    assert code == 0, server.tail()
    assert "halformer.serve: stopped" in server.tail()
