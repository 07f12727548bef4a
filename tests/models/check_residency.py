"""GPU residency: a decode on a GPU device keeps activations on the device, and gives
the CPU's results.

    check_residency.py BINARY WEIGHTS DEVICE   (opencl on PoCL: HL_OCL_DEVICE_TYPE=cpu)

The runtime counts every host<->device copy it makes (--json "transfers"). A greedy
decode of N steps over B sources (longest S tokens), max_new_tokens n, may make only:
  uploads:   source ids (S*B int32), source mask (S*B floats), decoder self-mask
             (n*B floats), then the token ids (B int32) of each step      -> N + 3
  downloads: the argmax ids (B int32) of each step, the last logits (B*V floats)
             once at the end                                               -> N + 1
so nothing of activation size moves between layers or steps. Weights go up once per
model: a second run (--repeat 2) uploads none. Greedy (with and without the KV cache)
and beam search must also give the CPU's tokens and logits (1e-4 x scale)."""
import json
import subprocess
import sys

SOURCES = ["34 28 36 23 6 9 15", "18 3"]


def run(binary, weights, device, *args):
    cmd = [binary, "--weights", weights, "--device", device, "--json"]
    for s in SOURCES:
        cmd += ["--src", s]
    out = subprocess.run(cmd + list(args), check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out)


def fail(msg):
    sys.exit("FAIL: " + msg)


def main():
    binary, weights, device = sys.argv[1:4]
    B, S = len(SOURCES), max(len(s.split()) for s in SOURCES)
    cpu_default = run(binary, weights, "cpu", "--beam", "1", "-n", "2")
    if "transfers" in cpu_default:
        fail("the CPU run reports device transfers")

    for n in (1, 4, 10):
        gpu = run(binary, weights, device, "--beam", "1", "-n", str(n), "--logits")
        cpu = run(binary, weights, "cpu", "--beam", "1", "-n", str(n), "--logits")
        x = gpu["transfers"]
        N = len(gpu["timing"]["steps_ms"])
        V = len(gpu["sequences"][0]["logits"])
        want = {
            "uploads": N + 3,
            "upload_bytes": 4 * (S * B + S * B + n * B + N * B),
            "downloads": N + 1,
            "download_bytes": 4 * (N * B + B * V),
        }
        got = {k: x[k] for k in want}
        print(f"greedy n={n}: {N} steps, transfers {x}")
        if got != want:
            fail(f"greedy n={n}: transfers {got}, expected {want}")
        if x["device_copies"] > N * B:
            fail(f"greedy n={n}: {x['device_copies']} device copies for {N} steps of {B} rows")
        for g, c in zip(gpu["sequences"], cpu["sequences"]):
            if g["tokens"] != c["tokens"]:
                fail(f"greedy n={n}: {device} tokens {g['tokens']} != cpu {c['tokens']}")
            err = max(abs(a - b) for a, b in zip(g["logits"], c["logits"]))
            scale = max(abs(b) for b in c["logits"])
            print(f"  last logits: max |{device} - cpu| = {err:.3g} (scale {scale:.3g})")
            if err > 1e-4 * scale:
                fail(f"greedy n={n}: last logits differ by {err}")

    once = run(binary, weights, device, "--beam", "1", "-n", "4")["transfers"]
    twice = run(binary, weights, device, "--beam", "1", "-n", "4", "--repeat", "2")["transfers"]
    print(f"greedy n=4, two runs: transfers {twice}")
    if twice["weight_uploads"] != once["weight_uploads"] or once["weight_uploads"] == 0:
        fail(f"weights uploaded {once['weight_uploads']} times in one run, {twice['weight_uploads']} in two")
    for k in ("uploads", "upload_bytes", "downloads", "download_bytes"):
        if twice[k] != 2 * once[k]:
            fail(f"{k}: {twice[k]} in two runs, {once[k]} in one")

    for args in (["--beam", "1", "-n", "10", "--no-cache"], ["--beam", "3", "-n", "10"]):
        gpu = run(binary, weights, device, *args)
        cpu = run(binary, weights, "cpu", *args)
        for g, c in zip(gpu["sequences"], cpu["sequences"]):
            if "tokens" in c and g["tokens"] != c["tokens"]:
                fail(f"{' '.join(args)}: {device} tokens {g['tokens']} != cpu {c['tokens']}")
            # Beam scores: sums of log-probs on the host, from the device's logits.
            for hg, hc in zip(g.get("hypotheses", []), c.get("hypotheses", [])):
                if hg["tokens"] != hc["tokens"] or abs(hg["score"] - hc["score"]) > 1e-4:
                    fail(f"{' '.join(args)}: {device} hypothesis {hg} != cpu {hc}")
        print(f"{' '.join(args)}: {device} == cpu, transfers {gpu['transfers']}")
    print("OK")


if __name__ == "__main__":
    main()
