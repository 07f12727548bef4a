#!/usr/bin/env python3
"""Register staging on the GPU must cut the memory instructions per FMA in a kernel's inner
loops, from the PTX alone, on any machine (no GPU needed):
* linear's gpu_stage_k: the unstaged many-row matmul is bound by L1 load throughput on an
  H200 (docs/gpu.md); staging loads each K chunk as float4 vectors instead of a float4
  and reg_m scalar loads per step;
* attention's gpu_score_queries / gpu_v_queries: the scores and the V product summed in
  registers instead of a shared-memory read-modify-write per FMA.
A schedule change that silently drops either (a chunk that no longer divides K, alignment
Halide can no longer prove, an allocation moved back to shared memory) fails here.

    check_ptx_loads.py BASELINE.a CHANGED.a [--max-ratio 0.6] [--loops REGEX]

Both libraries: the same layer compiled for CUDA without and with the knob. For each, the
kernel whose inner loops (single-block loops, optionally only those named by --loops)
hold the most FMAs: global loads, shared loads and shared stores per fma.rn.f32. Exit 1
unless changed / baseline is at most --max-ratio.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ptxas_check  # noqa: E402  (extract_ptx)

MEM_RE = re.compile(r"\b(?:ld\.global(?:\.nc)?|ld\.shared|st\.shared)(\.v[248])?\.\w+")
FMA_RE = re.compile(r"\bfma\.rn\.f32\b")


LABEL_RE = re.compile(r"^(\$L__BB\d+_\d+):([^\n]*)", re.M)


def inner_loops(body, loop_re):
    """(memory instructions, FMAs) summed over the kernel's innermost loops whose label
    (LLVM names it after Halide's loop, e.g. `for_qk.s1.rd`) matches loop_re: basic blocks
    that branch back to their own label, the loops the kernel spends its time in."""
    mem = fma = 0
    labels = list(LABEL_RE.finditer(body))
    for n, m in enumerate(labels):
        block = body[m.end(): labels[n + 1].start() if n + 1 < len(labels) else len(body)]
        if loop_re.search(m.group(2)) and re.search(r"\bbra(?:\.uni)?\s+" + re.escape(m.group(1)) + r"\s*;", block):
            mem += len(MEM_RE.findall(block))
            fma += len(FMA_RE.findall(block))
    return mem, fma


def busiest_kernel(lib, loop_re):
    """(name, memory instructions, FMAs) of the inner loops of the kernel whose inner loops
    hold the most FMAs in lib."""
    with open(lib, "rb") as f:
        modules = ptxas_check.extract_ptx(f.read())
    best = None
    for ptx in modules:
        for body in re.split(r"\.entry\s+", ptx)[1:]:
            k = (body.split("(", 1)[0],) + inner_loops(body, loop_re)
            if best is None or k[2] > best[2]:
                best = k
    if best is None or best[2] == 0:
        sys.exit(f"check_ptx_loads: no loop with FMAs in {lib}")
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("baseline")
    ap.add_argument("staged")
    ap.add_argument("--max-ratio", type=float, default=0.6)
    ap.add_argument("--loops", default="", help="regex on the loops' names (default: every inner loop)")
    a = ap.parse_args()
    per_fma = []
    for lib in (a.baseline, a.staged):
        name, mem, fmas = busiest_kernel(lib, re.compile(a.loops))
        per_fma.append(mem / fmas)
        print(f"{os.path.basename(lib)}: kernel {name}, inner loops: {mem} loads / shared stores for {fmas} FMAs "
              f"= {mem / fmas:.3f} per FMA")
    ratio = per_fma[1] / per_fma[0]
    print(f"{os.path.basename(a.staged)} / {os.path.basename(a.baseline)}: {ratio:.2f} (at most {a.max_ratio})")
    return 0 if ratio <= a.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
