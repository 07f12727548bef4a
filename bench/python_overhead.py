"""The Python layer's cost over the C++ API (issue 13), on one built model:
the inference binary times its own Model calls in-process (--time --repeat; C++
steady_clock around Model::pooled / the per-step wall times of the decode), and the
same calls are timed here through the `halformer` package (time.perf_counter around
each call, same inputs, same threads). Medians; overhead = Python / C++ - 1.

  pooled (encoder-only models, e.g. MiniLM): the median of Model.pooled(batch)
  decode (encoder-decoder / decoder-only): per step = (T(N) - T(1)) / (N - 1) of whole
      generate() calls in Python vs the binary's median step, and the whole
      generate(N) call vs encoder + N steps of the binary.

usage (PYTHONPATH=build/python):
  python bench/python_overhead.py pooled MODEL_DIR WEIGHTS --batch 32 --length 128
  python bench/python_overhead.py decode MODEL_DIR WEIGHTS --batch 1 --length 128 --new-tokens 32
"""
import argparse
import glob
import json
import os
import random
import statistics
import subprocess
import tempfile
import time

import halformer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["pooled", "decode"])
    ap.add_argument("model_dir")
    ap.add_argument("weights")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    m = halformer.Model(a.model_dir, weights=a.weights, threads=a.threads)
    cfg = m.config
    binary = [p for p in glob.glob(os.path.join(a.model_dir, "*")) if os.access(p, os.X_OK) and os.path.isfile(p)
              and not p.endswith((".so", ".a", ".h"))][0]
    rng = random.Random(0)
    vocab = cfg["src_vocab"] if cfg["arch"] != "decoder" else cfg["tgt_vocab"]
    lo = max(cfg["pad_id"], cfg["bos_id"], cfg["eos_id"]) + 1
    ids = [[rng.randrange(lo, vocab) for _ in range(a.length)] for _ in range(a.batch)]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(" ".join(map(str, r)) for r in ids) + "\n")
    cli = [binary, "--weights", a.weights, "--src-file", f.name, "--threads", str(a.threads), "--json",
           "--repeat", str(a.repeat)]

    def timed(fn, n):
        fn()  # warm-up
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)

    if a.mode == "pooled":
        cpp = json.loads(subprocess.run(cli, capture_output=True, text=True, check=True).stdout)["timing"]["encoder_ms"]
        py = timed(lambda: m.pooled(ids), a.repeat)
        print(f"{cfg['name']} pooled b{a.batch} s{a.length}: C++ {cpp:.3f} ms, Python {py:.3f} ms, "
              f"overhead {100 * (py / cpp - 1):+.2f}%")
    else:
        N = a.new_tokens
        j = json.loads(subprocess.run(cli + ["-n", str(N)], capture_output=True, text=True, check=True).stdout)
        steps = [len(s["tokens"]) for s in j["sequences"]]
        cpp_step, cpp_enc = j["timing"]["step_ms"], j["timing"]["encoder_ms"]
        t_n = timed(lambda: m.generate(ids, max_new_tokens=N), a.repeat)
        t_1 = timed(lambda: m.generate(ids, max_new_tokens=1), a.repeat)
        py_step = (t_n - t_1) / (N - 1)
        cpp_total = cpp_enc + len(j["timing"]["steps_ms"]) * cpp_step
        print(f"{cfg['name']} decode b{a.batch} s{a.length}, {N} new tokens (rows made {steps}): "
              f"step C++ {cpp_step:.3f} ms, Python {py_step:.3f} ms ({100 * (py_step / cpp_step - 1):+.2f}%); "
              f"whole call C++ {cpp_total:.2f} ms, Python {t_n:.2f} ms ({100 * (t_n / cpp_total - 1):+.2f}%)")
    os.unlink(f.name)


if __name__ == "__main__":
    main()
