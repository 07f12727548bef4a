"""`halformer quantize` files load as they are and change nothing.

usage: check_quantize.py HALFORMER WORKDIR CASE...   CASE = NAME:PRECISION:SPEC:WEIGHTS:BINARY[:FP32_BINARY]

For each case, `halformer quantize SPEC WEIGHTS --precision P` writes a file; the model's
build at that precision, given it, must produce bit-identical outputs (--dump, byte for
byte) to the same binary given the original weights -- the runtime quantizes at load as
quantize did, so any difference is a bug in one of them. The file must hold its linears
(and, in int8 and int4, its token tables: I8) in the precision's dtype (int4: U8 Q4_0
blocks) with F32 scales, and be smaller.
With FP32_BINARY, the fp32 build must refuse the quantized file, naming a tensor; then the
int8 file is damaged (a scale dropped, a scale of the wrong shape, a negative scale) and
the int8 build must refuse each with the tensor named. Last, the command's own refusals:
an existing output without --force, the input as output, an fp32 spec.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file, save_file
from safetensors import safe_open


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def outputs(binary, weights, dump):
    generates = "--max-new-tokens" in run([binary, "--help"]).stdout
    r = run([binary, "--weights", weights, "--src", "3 7 1 9", "--src", "5 2 11 4 8 6", "--dump", dump]
            + (["--max-new-tokens", "6"] if generates else []))
    if r.returncode != 0:
        raise SystemExit(f"FAIL {binary} --weights {weights}: exit {r.returncode}\n{r.stderr}")
    return load_file(dump)


def expect_refusal(what, r, *needles):
    text = r.stdout + r.stderr
    ok = r.returncode != 0 and "Traceback" not in text and all(n in text for n in needles)
    first = next((line for line in text.splitlines() if any(n in line for n in needles)), text.strip()[:200])
    print(f"{'ok  ' if ok else 'FAIL'} {what}: exit {r.returncode}: {first.strip()}")
    return ok


def damaged(src, dst, change):
    tensors = load_file(src)
    with safe_open(src, "np") as f:
        meta = f.metadata()
    change(tensors)
    save_file(tensors, dst, metadata=meta)
    return dst


def check_case(halformer, work, name, precision, spec, weights, binary, fp32_binary=None):
    ok = True
    out = os.path.join(work, f"{name}.{precision}.safetensors")
    if os.path.exists(out):
        os.remove(out)
    r = run([halformer, "quantize", spec, weights, "--precision", precision, "-o", out])
    if r.returncode != 0:
        print(f"FAIL {name} {precision}: quantize exit {r.returncode}\n{r.stdout}{r.stderr}")
        return False
    got = outputs(binary, out, os.path.join(work, f"{name}-{precision}-quantized.out.safetensors"))
    want = outputs(binary, weights, os.path.join(work, f"{name}-{precision}-original.out.safetensors"))
    same = got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    size_in, size_out = os.path.getsize(weights), os.path.getsize(out)
    print(f"{'ok  ' if same else 'FAIL'} {name} {precision}: outputs of the quantized file "
          f"{'bit-identical to' if same else 'differ from'} the original's ({len(want)} tensors); "
          f"file {size_out} bytes = {size_out / size_in:.2f} x {size_in}")
    ok &= same
    with safe_open(out, "np") as f:
        meta = f.metadata()
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    want_dtype = {"int8": "I8", "bf16": "BF16", "int4": "U8"}[precision]
    linears = [k for k in dtypes if k.endswith(".weight") and ("attn." in k or ".ff" in k) and "norm" not in k]
    layered = bool(linears) and all(dtypes[k] == want_dtype for k in linears)
    tables = [k for k in dtypes if k.endswith("embedding.weight") and "pos" not in k and "type" not in k]
    tables_ok = all(dtypes[k] == ("I8" if precision in ("int8", "int4") else "F32") for k in tables)
    scales_ok = all(k + "_scale" in dtypes for k in dtypes if dtypes[k] in ("I8", "U8"))
    formats_ok = (meta.get("halformer.names") == "canonical" and layered and tables_ok and scales_ok
                  and size_out < size_in)
    print(f"{'ok  ' if formats_ok else 'FAIL'} {name} {precision}: {len(linears)} linears {want_dtype}, tables "
          f"{sorted(dtypes[k] for k in tables)}, every I8 / U8 tensor with its _scale, metadata {meta}")
    ok &= formats_ok
    if fp32_binary:
        ok &= expect_refusal(f"{name}: the fp32 build given the {precision} file",
                             run([fp32_binary, "--weights", out, "--src", "3 4"]), "halformer quantize")
        scale = next(k for k in dtypes if k.endswith("_scale") and "attn" in k)
        cases = [
            ("a scale dropped", lambda t: t.pop(scale), [scale, "missing"]),
            ("a scale of the wrong shape", lambda t: t.__setitem__(scale, t[scale][:-1].copy()), [scale, "expected F32"]),
            ("a negative scale", lambda t: t[scale].__setitem__(0, -1.0), [scale, "finite and >= 0"]),
        ]
        for i, (what, change, needles) in enumerate(cases):
            bad = damaged(out, os.path.join(work, f"{name}-damaged-{i}.safetensors"), change)
            ok &= expect_refusal(f"{name}: {what}", run([binary, "--weights", bad, "--src", "3 4"]), *needles)
        ok &= expect_refusal(f"{name}: existing output without --force",
                             run([halformer, "quantize", spec, weights, "--precision", precision, "-o", out]),
                             "exists", "--force")
        copy = os.path.join(work, f"{name}-input-copy.safetensors")
        shutil.copyfile(weights, copy)
        before = open(copy, "rb").read()
        ok &= expect_refusal(f"{name}: the input as output",
                             run([halformer, "quantize", spec, copy, "--precision", precision, "-o", copy,
                                  "--force"]), "refusing to overwrite")
        unchanged = open(copy, "rb").read() == before
        print(f"{'ok  ' if unchanged else 'FAIL'} {name}: the input file unchanged")
        ok &= unchanged
        ok &= expect_refusal(f"{name}: an fp32 spec",
                             run([halformer, "quantize", spec, weights, "--precision", "fp32", "-o",
                                  os.path.join(work, "never.safetensors")]), "nothing to quantize")
    return ok


def main(halformer, work, *cases):
    os.makedirs(work, exist_ok=True)
    ok = True
    for case in cases:
        ok &= check_case(halformer, work, *case.split(":"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
