"""Counts the dot-product instructions in the reduced-precision linear kernels' assembly.

usage: check_kernel_asm.py host=K1.s host=K2.s ... narrow=K.s host_int16=K.s avx2=K.s avx2_narrow=K.s vnni=K.s
                          amx=K.s bf16=K.s bf16_zen4=K.s bf16_amx=K.s host_vector=K.s bf16_vector=K.s

int8 (generators/linear_int8.cpp): host= kernels (built for this machine; AVX2 at least)
must multiply their int16 pairs with vpmaddwd, or where the host is a Zen 4 class CPU
(Halide's avx512_zen4 and later: AVX-512 VNNI and BF16) their uint8 x int8 quads with
vpdpbusd; host_int16= kernels (this machine, int16 activations forced) int16 pairs,
vpmaddwd or vpdpwssd; avx2= kernels (built for plain AVX2) must use vpmaddwd; vnni= kernels
(built for Zen 4, whatever this CPU is) must use vpdpbusd; amx= kernels (built for Sapphire
Rapids, whatever this CPU is) vpdpbusd for up to 8 rows and tdpbusd (AMX tiles) for more,
as must host= and narrow= kernels where this CPU has AMX (host_vector= kernels: a K whose
padded length is not a multiple of two k groups, which keeps the vector path). Every kernel but narrow= ones must also load its weights as vectors: more than
MAX_INSERTS byte or word inserts (vpinsrb, vpinsrw) means Halide gathers the weights an
element at a time (an int8 register tile off the panel grid did that: 156 per kernel, 2x
slower; so did bf16 pairs indexed as 2 * (n % panel) + s: 140). An insert whose operand is a stack
slot (`N(%rsp)`, LLVM reloading a spilled scalar into a lane) is not counted: it reads no
weight (seen on AVX2 in the argument checks before the loops: 11 such in a bf16 kernel).
narrow= kernels (fewer features than a vector; also avx2_narrow=) are exempt from that check.

bf16 (generators/linear.cpp's linear_bf16): bf16_zen4= kernels (built for Zen 4, AVX-512
BF16) must multiply bf16 pairs with vdpbf16ps; bf16= kernels (built for this machine) too
where this CPU has AVX-512 BF16, and elsewhere have none (they widen the weights to fp32);
where this CPU has AMX they must also hold tdpbf16ps (bf16_vector=: a K without AMX), as
must bf16_amx= kernels (built for Sapphire Rapids, whatever this CPU is).

Fewer than MIN_COUNT of the wanted instruction in a kernel means its matmul fell back to
something else (scalar or widened multiplies): the test fails.
"""
import re
import sys

MIN_COUNT = 8
INSTRUCTIONS = ("vpmaddwd", "vpdpwssd", "vpdpbusd", "vdpbf16ps", "vpinsrb", "vpinsrw", "tdpbusd", "tdpbf16ps")
# An AMX kernel's tile multiply is one instruction in a loop (a few per kernel: one per
# specialisation's copy of the loop).
MIN_TILE_COUNT = 1
MAX_INSERTS = 8  # vpinsrb + vpinsrw: the row-quantization and edge paths keep a few


def host_is_zen4_class():
    """Whether Halide's host target has avx512_zen4 (or later): AVX-512 BF16 and VNNI."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
        return all(re.search(r"\b%s\b" % f, flags) for f in ("avx512_bf16", "avx512_vnni"))
    except OSError:
        return False


def host_has_amx():
    """Whether this CPU has AMX (Halide's avx512_sapphirerapids: int8 and bf16 tiles)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
        return all(re.search(r"\b%s\b" % f, flags) for f in ("amx_tile", "amx_int8", "amx_bf16"))
    except OSError:
        return False


def wanted_tiles(kind):
    """The AMX instruction the kernel must also use (MIN_TILE_COUNT), or None."""
    if kind == "amx" or (kind in ("host", "narrow") and host_has_amx()):
        return "tdpbusd"
    if kind == "bf16_amx" or (kind == "bf16" and host_has_amx()):
        return "tdpbf16ps"
    return None


def wanted(kind):
    """(instructions of which MIN_COUNT are needed -- none: must have none, dense-load check)."""
    kind = kind.removesuffix("_vector")
    if kind == "bf16":
        return ("vdpbf16ps",) if host_is_zen4_class() else (), True
    int8_host = ("vpdpbusd",) if host_is_zen4_class() else ("vpmaddwd",)
    return {"host": (int8_host, True), "narrow": (int8_host, False),
            "avx2": (("vpmaddwd",), True), "avx2_narrow": (("vpmaddwd",), False),
            "host_int16": (("vpmaddwd", "vpdpwssd"), True),
            "vnni": (("vpdpbusd",), True), "amx": (("vpdpbusd",), True),
            "bf16_zen4": (("vdpbf16ps",), True), "bf16_amx": (("vdpbf16ps",), True)}[kind]


def main(args):
    failed = False
    for arg in args:
        kind, _, path = arg.partition("=")
        text = open(path).read()
        counts = {ins: len(re.findall(r"\b%s\b(?![^\n]*\(%%rsp\))" % ins, text)) for ins in INSTRUCTIONS}
        want, dense_check = wanted(kind)
        if want:
            ok = sum(counts[i] for i in want) >= MIN_COUNT
            need = f"need >= {MIN_COUNT} of {'/'.join(want)}"
        else:
            ok = counts["vdpbf16ps"] == 0
            need = "this CPU has no vdpbf16ps: need none"
        tiles = wanted_tiles(kind)
        if tiles:
            ok &= counts[tiles] >= MIN_TILE_COUNT
            need += f", >= {MIN_TILE_COUNT} {tiles}"
        if dense_check:
            ok &= counts["vpinsrb"] + counts["vpinsrw"] <= MAX_INSERTS
            need += f", <= {MAX_INSERTS} vpinsrb/w"
        failed |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} {kind:9} {path.rsplit('/', 1)[-1]}: " +
              ", ".join(f"{k} {v}" for k, v in counts.items()) + f" ({need})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
