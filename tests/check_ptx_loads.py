#!/usr/bin/env python3
"""The GPU matmul's register staging (linear's gpu_stage_k) must cut the load instructions
its many-row loop issues per FMA: the unstaged kernel is bound by L1 load throughput on an
H200 (docs/gpu.md), and staging loads each K chunk as vectors instead of a float4 and
reg_m scalar loads per step. A schedule change that silently drops the staging (a chunk
that no longer divides K, alignment Halide can no longer prove) fails here, on any
machine, from the PTX alone.

    check_ptx_loads.py BASELINE.a STAGED.a [--max-ratio 0.6]

Both libraries: the same linear sizes compiled for CUDA, without and with staging. For
each, the kernel with the most FMAs (the many-row one) is measured: global load
instructions (scalar or vector) per fma.rn.f32. Exit 1 unless staged / baseline is at
most --max-ratio.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import ptxas_check  # noqa: E402  (extract_ptx)

LOAD_RE = re.compile(r"\bld\.global(?:\.nc)?(\.v[248])?\.\w+")
FMA_RE = re.compile(r"\bfma\.rn\.f32\b")


def busiest_kernel(lib):
    """(name, loads, vector loads, fmas) of the kernel with the most FMAs in lib."""
    with open(lib, "rb") as f:
        modules = ptxas_check.extract_ptx(f.read())
    best = None
    for ptx in modules:
        for body in re.split(r"\.entry\s+", ptx)[1:]:
            loads = LOAD_RE.findall(body)
            k = (body.split("(", 1)[0], len(loads), sum(1 for v in loads if v), len(FMA_RE.findall(body)))
            if best is None or k[3] > best[3]:
                best = k
    if best is None or best[3] == 0:
        sys.exit(f"check_ptx_loads: no kernel with FMAs in {lib}")
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("baseline")
    ap.add_argument("staged")
    ap.add_argument("--max-ratio", type=float, default=0.6)
    a = ap.parse_args()
    per_fma = []
    for lib in (a.baseline, a.staged):
        name, loads, vec, fmas = busiest_kernel(lib)
        per_fma.append(loads / fmas)
        print(f"{os.path.basename(lib)}: kernel {name}: {loads} global loads ({vec} vector) for {fmas} FMAs "
              f"= {loads / fmas:.3f} per FMA")
    ratio = per_fma[1] / per_fma[0]
    print(f"staged / unstaged loads per FMA: {ratio:.2f} (at most {a.max_ratio})")
    return 0 if ratio <= a.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
