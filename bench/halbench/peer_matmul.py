"""Matmul shapes in isolation for the BLAS-backed peers: torch (F.linear, what nn.Linear
calls) and numpy (matmul into a preallocated output, then += bias), fp32, `threads`
threads (torch.set_num_threads; numpy through OPENBLAS/OMP/MKL_NUM_THREADS set by the
harness before this process starts).

Same protocol as halformer_matmul_bench: out[M, N] = x[M, K] w + b, weights cycled over
enough distinct copies to exceed `cold_bytes` (so decode shapes read weights from DRAM,
as in a model), a sample = enough consecutive calls to last >= min_ms, median over
`samples` samples after one warm-up sample. Each system takes its natural weight layout:
torch [N, K] (nn.Linear), numpy [K, N].
"""
from __future__ import annotations

import math
import time

from .common import peer_main


def bench(call_fn, make_copy, wbytes, samples, min_ms, cold_bytes):
    copies = int(min(64, max(1, math.ceil(cold_bytes / wbytes))))
    ws = [make_copy() for _ in range(copies)]
    i = [0]

    def call():
        call_fn(ws[i[0]])
        i[0] = (i[0] + 1) % copies

    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        ms = (time.perf_counter() - t0) * 1e3
        if ms >= min_ms or calls >= (1 << 20):
            break
        calls = max(calls * 2, int(calls * min_ms / max(ms, 1e-3)))
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        out.append((time.perf_counter() - t0) * 1e3 / calls)
    return out, copies, calls


def body(task, res):
    shapes = task["shapes"]
    systems = {}
    try:
        import torch

        torch.set_num_threads(task["threads"])
        systems["torch"] = torch.__version__
    except ImportError:
        res.note("torch not installed: no torch matmul")
    try:
        import numpy as np

        systems["numpy"] = np.__version__
    except ImportError:
        res.note("numpy not installed: no numpy matmul")
    res.data["versions"] = systems
    for shape in shapes:
        m, k, n = (int(v) for v in shape.split("x"))
        wbytes = 4.0 * k * n
        if "torch" in systems:
            import torch

            g = torch.Generator().manual_seed(m + k + n)
            x = torch.randn(m, k, generator=g)
            b = torch.randn(n, generator=g) * 0.05
            with torch.inference_mode():
                samples, copies, calls = bench(
                    lambda w: torch.nn.functional.linear(x, w, b),
                    lambda: torch.randn(n, k, generator=g) / math.sqrt(k),
                    wbytes, task["samples"], task["min_ms"], task["cold_bytes"])
            res.timing("matmul", m, samples, system="torch", shape=shape, copies=copies, calls_per_sample=calls)
        if "numpy" in systems:
            import numpy as np

            rng = np.random.default_rng(m + k + n)
            x = rng.standard_normal((m, k), dtype=np.float32)
            b = (rng.standard_normal(n, dtype=np.float32) * 0.05).astype(np.float32)
            o = np.empty((m, n), np.float32)

            def np_linear(w):
                np.matmul(x, w, out=o)
                np.add(o, b, out=o)

            samples, copies, calls = bench(
                np_linear, lambda: (rng.standard_normal((k, n), dtype=np.float32) / math.sqrt(k)).astype(np.float32),
                wbytes, task["samples"], task["min_ms"], task["cold_bytes"])
            res.timing("matmul", m, samples, system="numpy", shape=shape, copies=copies, calls_per_sample=calls)
    if not systems:
        res.finish("skipped", "neither torch nor numpy is installed")


if __name__ == "__main__":
    peer_main("matmul-peers", body)
