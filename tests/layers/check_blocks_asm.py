"""Checks the block-quantized linear kernels' assembly (generators/linear_blocks.cpp: int4,
q8_0) for their dot products.

usage: check_blocks_asm.py vnni=K1.s;K2.s avx2=K1.s;K2.s ...

vnni= kernels (built for Zen 4 class CPUs, AVX-512 VNNI, whatever this CPU is) must sum
their uint8 x int8 quads with vpdpbusd; avx2= kernels (plain AVX2) with vpmaddwd (int16 pairs,
widened from the bytes: Halide emits vpmaddubsw only where it can prove no saturation). Fewer than MIN_COUNT means the block sums fell back to widened multiplies.
More than MAX_INSERTS byte inserts means Halide gathered the weights byte by byte (an insert
from a stack slot, LLVM reloading a spilled scalar, reads no weight and is not counted).
"""
import re
import sys

MIN_COUNT = 8
MAX_INSERTS = 8
WANTED = {"vnni": ("vpdpbusd",), "avx2": ("vpmaddwd",)}


def count(path, instr):
    with open(path) as f:
        lines = re.findall(r"^\s*%s\b.*$" % instr, f.read(), re.M)
    return sum(1 for line in lines if "(%rsp)" not in line)


def main(args):
    failures = []
    for arg in args:
        kind, _, paths = arg.partition("=")
        for path in filter(None, re.split(r"[;]", paths)):
            for instr in WANTED[kind]:
                n = count(path, instr)
                print("%s %s: %d %s" % (kind, path, n, instr))
                if n < MIN_COUNT:
                    failures.append("%s: %d %s (want >= %d)" % (path, n, instr, MIN_COUNT))
            inserts = 0 if "narrow" in path else count(path, "vpinsrb")  # fewer features than a vector
            if inserts > MAX_INSERTS:
                failures.append("%s: %d vpinsrb: weights gathered byte by byte" % (path, inserts))
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
