#!/usr/bin/env python3
"""Bit-identical outputs across runs and thread counts (issue 8, item 7).

usage: determinism.py BINARY WEIGHTS [CONCURRENCY_BINARY]

Runs the inference binary on one batch (sequences of different lengths, so padding and
masking are involved, up to max_len) with --dump (encoder output, greedy tokens,
teacher-forced head output) and compares the dumped files byte for byte: twice with
the default thread count, then with --threads 1, 2 and 4. With CONCURRENCY_BINARY
(tests/reliability/concurrency.cpp, built against the model library), also compares
its checksum of 100 inferences under HL_NUM_THREADS=1, 2 and 4.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

if len(sys.argv) not in (3, 4):
    sys.exit(__doc__)
BIN, WEIGHTS = sys.argv[1], sys.argv[2]
CONC = sys.argv[3] if len(sys.argv) == 4 else None
tmp = tempfile.mkdtemp(prefix="halformer-determinism-")

src = ["3 7 1 9", "5 4 3 2 1 13", "8", " ".join(str(1 + i % 13) for i in range(64)), "2 2 2 2 11 12"]
tgt = ["14 9 1", "14", "14 8 15", "14 " + " ".join(str(1 + i % 13) for i in range(40)), "14 12 11"]
src_file, tgt_file = os.path.join(tmp, "src.txt"), os.path.join(tmp, "tgt.txt")
open(src_file, "w").write("\n".join(src) + "\n")
open(tgt_file, "w").write("\n".join(tgt) + "\n")

failures = []


def run(tag, extra, env=None):
    dump = os.path.join(tmp, tag + ".safetensors")
    r = subprocess.run([BIN, "--weights", WEIGHTS, "--src-file", src_file, "--tgt-file", tgt_file,
                        "-n", "20", "--dump", dump] + extra, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **(env or {})))
    if r.returncode != 0:
        failures.append(f"{tag}: exit {r.returncode}: {r.stderr.strip()}")
        return None
    return r.stdout, open(dump, "rb").read()


runs = {
    "default_1": run("default_1", []),
    "default_2": run("default_2", []),
    "threads_1": run("threads_1", ["--threads", "1"]),
    "threads_2": run("threads_2", ["--threads", "2"]),
    "threads_4": run("threads_4", ["--threads", "4"]),
    "hl_num_threads_1": run("hl_num_threads_1", [], {"HL_NUM_THREADS": "1"}),
}
base = runs["default_1"]
for tag, out in runs.items():
    if out is None or base is None:
        continue
    same = out == base
    print(f"[{'ok' if same else 'FAIL'}] {tag}: {len(out[1])} dumped bytes, {len(out[0].splitlines())} sequences"
          + ("" if same else " -- differs from default_1"))
    if not same:
        failures.append(f"{tag}: output differs from default_1 (stdout equal: {out[0] == base[0]})")

if CONC:
    sums = {}
    for n in ("1", "2", "4"):
        r = subprocess.run([CONC, WEIGHTS, "1", "100"], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, HL_NUM_THREADS=n))
        m = re.search(r"checksum ([0-9a-f]+)", r.stdout)
        if r.returncode != 0 or not m:
            failures.append(f"library, HL_NUM_THREADS={n}: exit {r.returncode}: {r.stdout}{r.stderr}")
            continue
        sums[n] = m.group(1)
        print(f"[ok] library API, HL_NUM_THREADS={n}: 100 inferences, checksum {m.group(1)}")
    if len(set(sums.values())) > 1:
        failures.append(f"library checksums differ across thread counts: {sums}")

shutil.rmtree(tmp, ignore_errors=True)
if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"{len(runs)} binary runs bit-identical" + (", library checksums identical" if CONC else ""))
