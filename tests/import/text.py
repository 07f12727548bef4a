"""Text in and out of imported models' binaries through SentencePiece models made now
(Llama's tokenizer.model, T5's spiece.model, Marian's source.spm / target.spm) against the
transformers tokenizers and generate()."""

import json
import os
import shutil
import subprocess

import numpy as np

from compare import strip
from hf_models import T5_PIECES, VOCAB, llama_reference, transformers_modules


def train_spm(corpus_words, rng, prefix, size, lines, **kw):
    """A SentencePiece model of `size` pieces trained now on `lines` random sentences of the
    words (written to PREFIX.txt): PREFIX.model."""
    import sentencepiece as sp

    corpus = prefix + ".txt"
    with open(corpus, "w") as f:
        for _ in range(lines):
            f.write(" ".join(rng.choice(corpus_words, rng.integers(3, 12))) + "\n")
    sp.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=size, minloglevel=2, **kw)
    return prefix + ".model"


def spm_run(binary, hf_dir, spm_arg, texts):
    """The imported binary on `texts` through --spm: its JSON sequences (source, tokens, text)."""
    cmd = [binary, "--weights", os.path.join(hf_dir, "model.safetensors"), "--spm", spm_arg, "--json",
           "--max-new-tokens", "12"]
    for t in texts:
        cmd += ["--text", t]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr}")
    return cmd, json.loads(r.stdout)["sequences"]


def spm(hf_dir, binary, work):
    """A BPE SentencePiece model of exactly the checkpoint's 1003 pieces (unk 0, bos 1, eos 2:
    Llama's ids), trained now on random words, then text in and out of the binary."""
    import sentencepiece as sp
    import torch

    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(11)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = ["".join(rng.choice(letters, rng.integers(2, 8))) for _ in range(3000)]
    spm_model = train_spm(words, rng, os.path.join(work, "tokenizer"), VOCAB, 4000, model_type="bpe",
                          unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    tok = sp.SentencePieceProcessor(model_file=spm_model)
    assert tok.get_piece_size() == VOCAB, tok.get_piece_size()
    model = llama_reference(hf_dir)
    texts = [" ".join(words[i:i + n]) for i, n in ((0, 3), (10, 9), (40, 1))]
    cmd, out = spm_run(binary, hf_dir, spm_model, texts)
    for t, row in zip(texts, out):
        ids = [1] + tok.encode(t)
        if row["source"] != ids:
            raise SystemExit(f"{t!r}: the binary's ids {row['source']}, sentencepiece's {ids}")
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, num_beams=1,
                                 pad_token_id=2, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        new = gen[0, len(ids):].tolist()
        want = tok.decode(new[:new.index(2)] if 2 in new else new)
        if row["tokens"] != new or row["text"] != want:
            raise SystemExit(f"{t!r}: the binary gives {row['tokens']} {row['text']!r}, transformers + "
                             f"sentencepiece {new} {want!r}")
        print(f"{t!r} -> {row['text']!r}: ids and text equal transformers + sentencepiece")
    plain = subprocess.run([a for a in cmd if a != "--json"], capture_output=True, text=True).stdout.splitlines()
    if plain != [row["text"] for row in out]:
        raise SystemExit(f"plain output {plain} is not the JSON's text")
    print(f"spm: {len(texts)} texts through a {VOCAB}-piece SentencePiece model, plain output = JSON text")


def seq2seq_text(binary, hf_dir, spm_args, texts, tok, model, **generate_options):
    """An encoder-decoder's text through the binary (each --spm in spm_args) against the
    Hugging Face tokenizer `tok` + model.generate (greedy, 12 tokens) + tok.decode: ids,
    tokens and text equal. Returns the set of generated ids."""
    import torch

    seen, name = set(), type(tok).__name__
    for spm_arg in spm_args:
        _, out = spm_run(binary, hf_dir, spm_arg, texts)
        for t, row in zip(texts, out):
            ids = tok(t).input_ids
            if row["source"] != ids:
                raise SystemExit(f"{t!r}: the binary's ids {row['source']}, {name}'s {ids}")
            with torch.no_grad():
                gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=12, do_sample=False, num_beams=1, **generate_options)
            new = strip(gen[0, 1:].tolist(), model.config)
            want = tok.decode(new, skip_special_tokens=True)
            if row["tokens"] != new or row["text"] != want:
                raise SystemExit(f"{t!r}: the binary gives {row['tokens']} {row['text']!r}, transformers "
                                 f"{new} {want!r}")
            seen.update(new)
            print(f"--spm {os.path.basename(spm_arg)}: {t!r} -> {len(ids)} ids -> {row['text']!r}: equal to "
                  f"{name} + generate + decode")
    return seen


def spm_marian(hf_dir, binary, work):
    """Marian's tokenizer files made now: source.spm and target.spm trained on different words,
    vocab.json giving the model's 1003 ids to the union of their pieces (eos 0, pad 1002,
    as the test model's config), then text in and out of the binary (--spm DIR and --spm
    DIR/source.spm) against MarianTokenizer + MarianMTModel.generate + MarianTokenizer.decode."""
    tf = transformers_modules()
    os.makedirs(work, exist_ok=True)
    tok_dir = os.path.join(work, "marian-tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    rng = np.random.default_rng(12)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    src_words = ["".join(rng.choice(letters, rng.integers(2, 8))) for _ in range(2000)]
    tgt_words = ["".join(rng.choice(letters[::-1][:14], rng.integers(2, 8))) for _ in range(2000)]
    for name, words in (("source", src_words), ("target", tgt_words)):
        model = train_spm(words, rng, os.path.join(work, name), 400, 3000, model_type="unigram")
        shutil.copy(model, os.path.join(tok_dir, f"{name}.spm"))
    import sentencepiece as sp

    pieces = []
    for name in ("source", "target"):
        m = sp.SentencePieceProcessor(model_file=os.path.join(tok_dir, f"{name}.spm"))
        pieces += [m.id_to_piece(i) for i in range(m.get_piece_size()) if not m.is_control(i) and not m.is_unknown(i)]
    pieces = list(dict.fromkeys(pieces))  # the union, in order
    vocab = {"</s>": 0, "<unk>": 1, ">>xyz<<": 2}
    for p in pieces[:VOCAB - 4]:
        vocab[p] = len(vocab)
    while len(vocab) < VOCAB - 1:  # ids no SentencePiece model knows: decode as unk pieces
        vocab[f"\u2581extra{len(vocab)}"] = len(vocab)
    vocab["<pad>"] = VOCAB - 1
    with open(os.path.join(tok_dir, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False)
    tok = tf.MarianTokenizer(os.path.join(tok_dir, "source.spm"), os.path.join(tok_dir, "target.spm"),
                             os.path.join(tok_dir, "vocab.json"))
    model = tf.MarianMTModel.from_pretrained(hf_dir)
    model.eval()
    texts = [" ".join(src_words[i:i + n]) for i, n in ((0, 3), (10, 9), (40, 1))]
    texts += [">>xyz<< " + texts[0], "zzz qqq " + " ".join(tgt_words[:2]) + ", and " + src_words[5] + " ."]
    seq2seq_text(binary, hf_dir, (tok_dir, os.path.join(tok_dir, "source.spm")), texts, tok, model,
                 min_length=0, forced_bos_token_id=None, forced_eos_token_id=None)
    print(f"spm-marian: {len(texts)} texts, ids and text equal to transformers' MarianTokenizer and MarianMTModel")


def spm_t5(hf_dir, binary, work):
    """T5's spiece.model made now (a 400-piece unigram model with T5's pad 0, eos 1, unk 2;
    T5Tokenizer's sentinels fill the model's other ids), then text in and out of the binary
    (--spm DIR and --spm DIR/spiece.model) against T5Tokenizer + generate + decode."""
    tf = transformers_modules()
    os.makedirs(work, exist_ok=True)
    tok_dir = os.path.join(work, "t5-tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    rng = np.random.default_rng(13)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = ["".join(rng.choice(letters, rng.integers(2, 8))) for _ in range(2000)] + [",", ".", "?", "!", "'s"]
    model_file = train_spm(words, rng, os.path.join(work, "spiece"), T5_PIECES, 3000, model_type="unigram",
                           pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    shutil.copy(model_file, os.path.join(tok_dir, "spiece.model"))
    tok = tf.T5Tokenizer(os.path.join(tok_dir, "spiece.model"), extra_ids=VOCAB - T5_PIECES)
    model = tf.MT5ForConditionalGeneration.from_pretrained(hf_dir)
    model.eval()
    texts = [" ".join(words[i:i + n]) for i, n in ((0, 3), (10, 9), (40, 1))]
    texts += [words[3] + " , " + words[4] + " . " + words[5] + " ?", "QQQ " + words[7]]  # unknown letters
    seen = seq2seq_text(binary, hf_dir, (tok_dir, os.path.join(tok_dir, "spiece.model")), texts, tok, model)
    kinds = {"pieces": sum(3 <= i < T5_PIECES for i in seen), "sentinels": sum(i >= T5_PIECES for i in seen),
             "specials": sum(i < 3 for i in seen)}
    if not kinds["pieces"]:
        raise SystemExit(f"the generated ids {sorted(seen)} hold no ordinary piece: the text check would be empty")
    print(f"spm-t5: {len(texts)} texts, ids and text equal to T5Tokenizer and MT5ForConditionalGeneration "
          f"(generated ids: {kinds})")
