#!/usr/bin/env python3
"""all-MiniLM-L6-v2 through halformer's inference binary vs sentence-transformers.

    check_embeddings.py embeddings BIN REF_DIR CORPUS   every corpus line, batches of 32 and one by one
    check_embeddings.py semantic   BIN REF_DIR          similar sentences score higher than unrelated ones
    check_embeddings.py int8       BIN REF_DIR CORPUS   an int8 build (precision int8): every corpus
                                                        line, worst cosine >= 0.99, mean >= 0.998
    check_embeddings.py bf16       BIN REF_DIR CORPUS   a bf16 build: worst cosine >= 0.999

REF_DIR is what reference.py wrote (the package's model directory, the Hugging Face ids
and sentence-transformers' embeddings). The binary reads the corpus as text
(--text-file, --vocab: its own C++ tokenizer) with --max-length 256, sentence-transformers'
max_seq_length for this model. Per sentence: cosine >= 0.99999 and max |error| <= 1e-4.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

COS_MIN = 0.99999
ABS_MAX = 1e-4
MAX_LENGTH = 256


def read_lines(path):
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def model_files(ref):
    with open(os.path.join(ref, "model_dir.txt")) as f:
        d = f.read().strip()
    return os.path.join(d, "model.safetensors"), os.path.join(d, "vocab.txt")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)}\nexit {r.returncode}\n{r.stderr.decode(errors='replace')}")
    return r.stdout.decode("utf-8")


def compare(name, got, want, rows):
    """Per-row cosine and max abs error of got/want (corpus lines `rows`, 0-based);
    returns the rows that fail."""
    cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    err = np.max(np.abs(got - want), axis=1)
    bad = [rows[i] for i in range(len(got)) if not (cos[i] >= COS_MIN and err[i] <= ABS_MAX)]
    print(f"{name}: {len(got)} sentences, min cosine {cos.min():.9f} (line {rows[int(cos.argmin())] + 1}), "
          f"max abs error {err.max():.3g} (line {rows[int(err.argmax())] + 1}), failing {len(bad)}")
    return bad


def embeddings(binary, ref, corpus):
    weights, vocab = model_files(ref)
    lines = read_lines(corpus)
    want = np.load(os.path.join(ref, "embeddings.npy"))
    with open(os.path.join(ref, f"ids_{MAX_LENGTH}.txt")) as f:
        want_ids = [[int(x) for x in l.split()] for l in f.read().split("\n")[: len(lines)]]
    assert want.shape == (len(lines), 384), want.shape
    # Every line counts, including texts with a literal "[PAD]" (id 0 inside the
    # sequence): the runtime masks padding by length, as sentence-transformers does.
    strict = list(range(len(lines)))
    base = [binary, "--weights", weights, "--vocab", vocab, "--max-length", str(MAX_LENGTH)]
    failures = []
    for batch in (32, 1):
        out = json.loads(run(base + ["--text-file", corpus, "--batch-size", str(batch), "--json", "--threads", "2"]))
        seqs = out["sequences"]
        if len(seqs) != len(lines):
            sys.exit(f"error: {len(seqs)} outputs for {len(lines)} corpus lines")
        ids_bad = [i + 1 for i, s in enumerate(seqs) if s["source"] != want_ids[i]]
        print(f"batch {batch}: token ids identical to Hugging Face's on {len(lines) - len(ids_bad)}/{len(lines)} lines"
              + (f"; differ on lines {ids_bad[:20]}" if ids_bad else ""))
        got = np.array([s["output"] for s in seqs], dtype=np.float32)
        bad = compare(f"batch {batch}", got[strict], want[strict], strict)
        failures += [f"batch {batch}: ids differ on line {i}" for i in ids_bad]
        failures += [f"batch {batch}: line {i + 1} {lines[i][:60]!r}" for i in bad]

    # The other output forms on a few lines: one line of floats per text, and --dump.
    pick = [0, 3, len(lines) - 1]
    texts = sum((["--text", lines[i]] for i in pick), [])
    plain = run(base + texts).strip("\n").split("\n")
    got = np.array([[float(x) for x in l.split()] for l in plain], dtype=np.float32)
    if got.shape != (len(pick), 384):
        failures.append(f"plain output: shape {got.shape}, expected ({len(pick)}, 384)")
    else:
        failures += [f"plain output row {i}" for i in compare("plain text output (%.6g)", got, want[pick], pick)]
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "out.safetensors")
        run(base + texts + ["--batch-size", "2", "--dump", dump])
        from safetensors.numpy import load_file
        t = load_file(dump)
        head, enc = t["head_output"], t["encoder_output"]
        longest = max(len(want_ids[i]) for i in pick)
        if head.shape != (len(pick), 384) or enc.shape != (len(pick), longest, 384):
            failures.append(f"--dump: head_output {head.shape}, encoder_output {enc.shape}; expected "
                            f"({len(pick)}, 384) and ({len(pick)}, {longest}, 384)")
        else:
            failures += [f"--dump row {i}" for i in compare("--dump head_output", head, want[pick], pick)]
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures[:50]))
        return 1
    print(f"ok: {len(strict)} sentences within cosine >= {COS_MIN} and max abs error <= {ABS_MAX}, batched and single")
    return 0


# Reduced-precision builds vs sentence-transformers' fp32: (worst, mean) cosine bounds.
REDUCED_BOUNDS = {"int8": (0.99, 0.998), "bf16": (0.999, 0.999)}


def reduced(precision, binary, ref, corpus):
    """A reduced-precision build against sentence-transformers' fp32 embeddings, within
    docs/precision.md's bounds."""
    worst_min, mean_min = REDUCED_BOUNDS[precision]
    weights, vocab = model_files(ref)
    lines = read_lines(corpus)
    want = np.load(os.path.join(ref, "embeddings.npy"))
    out = json.loads(run([binary, "--weights", weights, "--vocab", vocab, "--max-length", str(MAX_LENGTH),
                          "--text-file", corpus, "--batch-size", "32", "--json", "--threads", "2"]))
    got = np.array([s["output"] for s in out["sequences"]], dtype=np.float32)
    if got.shape != want.shape:
        sys.exit(f"error: {got.shape[0]} outputs for {len(lines)} corpus lines")
    cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    worst = int(cos.argmin())
    ok = cos.min() >= worst_min and cos.mean() >= mean_min
    print(f"{'ok' if ok else 'FAILED'}: {precision} vs sentence-transformers (fp32) on {len(lines)} sentences: worst "
          f"cosine {cos.min():.6f} (line {worst + 1}: {lines[worst][:50]!r}), mean {cos.mean():.6f}, median "
          f"{np.median(cos):.6f} (bounds: worst >= {worst_min}, mean >= {mean_min})")
    return 0 if ok else 1


def semantic(binary, ref):
    weights, vocab = model_files(ref)
    # (anchor, paraphrase, unrelated): the paraphrase must be closer to the anchor.
    triples = [
        ("A man is playing a guitar.", "Someone is playing an acoustic guitar.", "The stock market fell sharply today."),
        ("How do I reset my password?", "I forgot my login credentials, how can I recover my account?",
         "What is the capital of France?"),
        ("The cat sits outside.", "A kitten is sitting outdoors.", "The new movie is awesome."),
        ("A woman is slicing onions.", "A chef is chopping vegetables.", "A man is riding a horse."),
        ("Paris is the capital of France.", "La capitale de la France est Paris.", "I love pasta."),
    ]
    texts = [t for tr in triples for t in tr]
    out = json.loads(run([binary, "--weights", weights, "--vocab", vocab, "--json"] + sum((["--text", t] for t in texts), [])))
    v = np.array([s["output"] for s in out["sequences"]], dtype=np.float64)
    norms = np.linalg.norm(v, axis=1)
    ok = bool(np.all(np.abs(norms - 1) < 1e-5))
    print(f"norms: {norms.min():.7f} .. {norms.max():.7f} (L2-normalised head)")
    for k, (a, p, u) in enumerate(triples):
        sp, su = float(v[3 * k] @ v[3 * k + 1]), float(v[3 * k] @ v[3 * k + 2])
        good = sp > su + 0.1
        ok &= good
        print(f"{'ok ' if good else 'BAD'} sim(paraphrase) {sp:.3f} > sim(unrelated) {su:.3f}: {a!r}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "embeddings":
        sys.exit(embeddings(*sys.argv[2:5]))
    if len(sys.argv) >= 5 and sys.argv[1] in REDUCED_BOUNDS:
        sys.exit(reduced(*sys.argv[1:5]))
    if len(sys.argv) >= 4 and sys.argv[1] == "semantic":
        sys.exit(semantic(*sys.argv[2:4]))
    sys.exit(__doc__)
