"""Counts the integer dot-product instructions in the int8 linear kernels' assembly.

usage: check_int8_asm.py host=K1.s host=K2.s ... narrow=K.s vnni=K.s

host= kernels (built for this machine; AVX2 at least) must multiply their int16 pairs
with vpmaddwd, or vpdpwssd where the host has AVX-512 VNNI; vnni= kernels (built for an
AVX-512 VNNI CPU, not run here) must use vpdpwssd. Fewer than MIN_COUNT in a kernel means
its matmul fell back to something else (scalar or widened multiplies): the test fails.

host= and vnni= kernels must also load their weights as vectors: more than MAX_VPINSRB
byte inserts means Halide gathers weights byte by byte (a register tile off the panel
grid did that: 156 per kernel, 2x slower). narrow= kernels (fewer features than a vector)
are exempt from that check.
"""
import re
import sys

MIN_COUNT = 8
MAX_VPINSRB = 8  # the row-quantization and edge paths keep a few
WANT = {"host": ("vpmaddwd", "vpdpwssd"), "narrow": ("vpmaddwd", "vpdpwssd"), "vnni": ("vpdpwssd",)}


def main(args):
    failed = False
    for arg in args:
        kind, _, path = arg.partition("=")
        text = open(path).read()
        counts = {ins: len(re.findall(r"\b%s\b" % ins, text)) for ins in ("vpmaddwd", "vpdpwssd", "vpdpbusd", "vpinsrb")}
        found = sum(counts[i] for i in WANT[kind])
        dense = kind == "narrow" or counts["vpinsrb"] <= MAX_VPINSRB
        ok = found >= MIN_COUNT and dense
        failed |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} {kind:6} {path.rsplit('/', 1)[-1]}: " +
              ", ".join(f"{k} {v}" for k, v in counts.items()) + f" (need >= {MIN_COUNT} of {'/'.join(WANT[kind])}" +
              ("" if kind == "narrow" else f", <= {MAX_VPINSRB} vpinsrb") + ")")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
