"""CTranslate2's figures on halformer's reduced-precision accuracy checks (issue 12), for
the closing notes and docs/precision.md. Report only: CTranslate2 lives in bench/.venv,
the tests do not depend on it.

    bench/.venv/bin/python bench/ct2_accuracy.py [--build-dir build]

1. all-MiniLM-L6-v2: CTranslate2's BERT encoder (converted from the same package
   directory, float32 and int8_float32) on the ids of the 246-line corpus that the test
   minilm_reference wrote (build/minilm/reference), mean-pooled and normalised as
   sentence-transformers does; cosine against sentence-transformers' fp32 embeddings.
2. reverse-tiny: the trained model converted with bench's own CTranslate2 converter
   (halbench.peer_ct2.build), greedy exact match on tools/train_reverse.py's 1000
   held-out sequences.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))  # check_reverse_accuracy
COMPUTE_TYPES = ("float32", "int8_float32")


def minilm(build_dir, work):
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    class Converter(TransformersConverter):
        # CTranslate2 4.8 passes from_pretrained(dtype=...), which the pinned transformers
        # (4.30) calls torch_dtype.
        def load_model(self, model_class, path, **kwargs):
            kwargs["torch_dtype"] = kwargs.pop("dtype", None)
            return model_class.from_pretrained(path, **kwargs)

    ref = os.path.join(build_dir, "minilm", "reference")
    if not os.path.exists(os.path.join(ref, "embeddings.npy")):
        sys.exit(f"{ref}: no reference (run: ctest --test-dir {build_dir} -R minilm_reference)")
    with open(os.path.join(ref, "model_dir.txt")) as f:
        model_dir = f.read().strip()
    out = os.path.join(work, "minilm-ct2")
    if not os.path.exists(os.path.join(out, "model.bin")):
        Converter(model_dir).convert(out, force=True)
    with open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8") as f:
        vocab = f.read().split("\n")
    want = np.load(os.path.join(ref, "embeddings.npy"))
    with open(os.path.join(ref, "ids_256.txt")) as f:
        ids = [[int(x) for x in line.split()] for line in f.read().split("\n")[: len(want)]]
    for ct in COMPUTE_TYPES:
        encoder = ctranslate2.Encoder(out, device="cpu", compute_type=ct, intra_threads=2)
        got = []
        for i in range(0, len(ids), 32):
            batch = ids[i:i + 32]
            hidden = np.array(encoder.forward_batch([[vocab[t] for t in s] for s in batch]).last_hidden_state)
            for j, s in enumerate(batch):
                e = hidden[j, :len(s)].mean(0)
                got.append(e / np.linalg.norm(e))
        got = np.array(got)
        cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        print(f"all-MiniLM-L6-v2, CTranslate2 {ct}: worst cosine {cos.min():.6f} (line {int(cos.argmin()) + 1}), "
              f"mean {cos.mean():.6f}, median {np.median(cos):.6f} over {len(cos)} sentences")


def reverse_tiny(work):
    import ctranslate2
    from check_reverse_accuracy import heldout
    from halbench.peer_ct2 import build, vocabulary

    spec = os.path.join(ROOT, "models", "reverse-tiny.yaml")
    weights = os.path.join(ROOT, "models", "reverse-tiny.safetensors")
    out = os.path.join(work, "reverse-tiny-ct2")
    build(spec, weights, out, lambda msg: None)
    pad, bos, eos, vocab_size = 0, 14, 15, 16  # models/reverse-tiny.yaml
    vocab = vocabulary(vocab_size, pad, bos, eos)
    index = {t: i for i, t in enumerate(vocab)}
    seqs = heldout()
    for ct in COMPUTE_TYPES:
        translator = ctranslate2.Translator(os.path.join(out, "seq2seq"), device="cpu", compute_type=ct,
                                            intra_threads=2)
        results = translator.translate_batch([[vocab[t] for t in s] for s in seqs], beam_size=1,
                                             max_decoding_length=64, return_end_token=True)
        hits = sum([index[t] for t in r.hypotheses[0]] == s[::-1] + [eos] for r, s in zip(results, seqs))
        print(f"reverse-tiny, CTranslate2 {ct}: greedy exact match {100 * hits / len(seqs):.1f}% "
              f"on {len(seqs)} held-out sequences")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default=os.path.join(HERE, ".cache", "accuracy"))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    minilm(args.build_dir, args.work)
    reverse_tiny(args.work)


if __name__ == "__main__":
    main()
