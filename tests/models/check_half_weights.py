"""F16 and BF16 checkpoints load and run exactly like their values in fp32.

usage: check_half_weights.py MODEL_BINARY WEIGHTS.safetensors WORKDIR

Many Hugging Face checkpoints are stored in float16 or bfloat16. The loader widens them to
fp32 as it reads them (every F16 / BF16 value is an fp32 value), so a model given the F16
file must produce bit-identical outputs to the same model given an F32 file holding the
F16-rounded values; likewise BF16. The F32 reference file is written by PyTorch (the
independent conversion), the outputs compared byte for byte (the binary's --dump).
"""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file


def run(binary, weights, dump):
    subprocess.run([binary, "--weights", weights, "--src", "3 7 1 9", "--src", "5 2 11 4 8 6",
                    "--max-new-tokens", "8", "--dump", dump], check=True, stdout=subprocess.DEVNULL)
    return load_file(dump)


def main(binary, weights, work):
    os.makedirs(work, exist_ok=True)
    fp32 = load_file(weights)
    failed = False
    for dtype, name in ((torch.float16, "F16"), (torch.bfloat16, "BF16")):
        half = os.path.join(work, f"weights-{name}.safetensors")
        widened = os.path.join(work, f"weights-{name}-as-f32.safetensors")
        save_file({k: v.to(dtype).contiguous() for k, v in fp32.items()}, half)
        save_file({k: v.to(dtype).float().contiguous() for k, v in fp32.items()}, widened)
        got = run(binary, half, os.path.join(work, f"out-{name}.safetensors"))
        want = run(binary, widened, os.path.join(work, f"out-{name}-as-f32.safetensors"))
        same = got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        rounding = max(float((fp32[k] - fp32[k].to(dtype).float()).abs().max()) for k in fp32)
        print(f"{'ok  ' if same else 'FAIL'} {name}: outputs {'bit-identical to' if same else 'differ from'} the "
              f"F32 file of the same values ({len(want)} tensors; weights rounded by up to {rounding:.2e})")
        failed |= not same
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
