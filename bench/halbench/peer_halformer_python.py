"""halformer through its Python package (issue 13): the same built model and weights as
the C++ row, called as a Python user would (`halformer.Model(...).encode(ids)`,
`.generate(ids, max_new_tokens=N)`), timed in Python around each call. The ratio to the
C++ row is the Python layer's overhead: argument conversion, the GIL release, the
numpy result (the runtime's output vector is handed over, not copied).

Decode per step is (T(N) - median T(1)) / (N - 1) of whole generate() calls (common.record_step_times), as for
CTranslate2: the decode loop runs in C++, so per-step Python cost is only what a call
costs once, spread over its steps.
"""
from __future__ import annotations

import os
import sys

from .common import (Unavailable, check_encoder, check_tokens, load_reference, peer_main, read_sources,
                     record_step_times, timed_runs)


def body(task, res):
    sys.path.insert(0, task["python_path"])
    try:
        import numpy as np

        import halformer
    except ImportError as e:
        raise Unavailable(f"the halformer Python package is not built ({e}; it is part of the CMake build)")
    th = task["threads"]
    m = halformer.Model(task["model_dir"], weights=task["weights"], threads=th)
    res.data["versions"] = {"halformer": "python package, " + os.path.dirname(halformer.__file__), "threads": th}
    n, eos = task["new_tokens"], task["eos"]
    for b in task["batches"]:
        info = task["inputs"][str(b)]
        ids = read_sources(info["src"])
        ref_enc, ref_greedy = load_reference(info["reference"])
        if "encoder" in task["scenarios"]:
            out = m.encode(ids)
            if res.check("encoder", b, check_encoder(out, ref_enc)):
                res.timing("encoder", b, timed_runs(lambda: m.encode(ids), task["warmup"], task["repeat_encoder"]))
        if "decode" in task["scenarios"] and n >= 2:
            toks = m.generate(ids, max_new_tokens=n)
            if res.check("decode", b, check_tokens(toks, ref_greedy.tolist(), eos)):
                if any(len(t) != n for t in toks):
                    res.note(f"decode b{b}: a row stopped at eos before {n} tokens; per-step time covers the batch")
                t_n = timed_runs(lambda: m.generate(ids, max_new_tokens=n), task["warmup"], task["repeat_decode"])
                t_1 = timed_runs(lambda: m.generate(ids, max_new_tokens=1), task["warmup"], task["repeat_decode"])
                record_step_times(res, b, t_n, t_1, n)


if __name__ == "__main__":
    peer_main("halformer-python", body)
