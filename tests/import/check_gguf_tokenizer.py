"""The tokenizer of a GGUF file (tokenizer.ggml.*), written by `halformer import` as
DIR/W.tokenizer.model and W.tokenizer.json (tests/import/CMakeLists.txt runs each step;
docs/import.md "The tokenizer of a GGUF file").

  make DIR                 a SentencePiece BPE with byte fallback trained now with Llama's
                           settings (DIR/original.model) and a tiny random Llama whose GGUF
                           carries it as convert_hf_to_gguf.py writes it (DIR/spm.gguf)
  spm DIR SPEC             the files imported beside SPEC: sentencepiece with the written
                           tokenizer.model gives the original's pieces and ids; tokenizers with
                           the written tokenizer.json gives the ids of transformers'
                           LlamaTokenizerFast converted from the original, and decodes back
  bpe HALFORMER DIR        byte-level BPEs trained now with tokenizers as GPT-2's, Qwen2's and
                           Llama 3's tokenizer.json are (pre "gpt-2", "qwen2", "llama-bpe"),
                           written as "gpt2" GGUFs and imported: the same ids, decoded back
  text DIR SPEC BIN        the binary built from SPEC, given --spm <written model> --text,
                           encodes as sentencepiece does (bos first)
  refuse CASE HALFORMER DIR  malformed tokenizer metadata: an error naming the key, nothing
                           written; or a tokenizer that is not written: one notice
"""

import json
import os
import re
import subprocess
import sys

import numpy as np

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")  # transformers 4.30's sentencepiece_model_pb2
import gguf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference"))
from halformer_torch.gguf_llama import LINEARS, llama_tensors  # noqa: E402  (the converter's tensor layout)

PIECES, HIDDEN, HEADS, KV_HEADS, FF, LAYERS = 400, 64, 4, 2, 100, 2
TEXTS = ["hello world", "  two leading spaces,  and  double ones", "line one\nline two\n\nthe end\n",
         "café über naïve straße", "emoji 🙂 and a rocket 🚀!", "trailing space ", "Tabs\tand 12345 digits",
         "日本語のテキスト"]
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def corpus(rng, lines=3000):
    letters = list("abcdefghijklmnopqrstuvwxyzéüABCDEFGH")
    words = ["".join(rng.choice(letters, rng.integers(1, 8))) for _ in range(800)] + ["hello", "world", "the"]
    return [" ".join(rng.choice(words, rng.integers(3, 12))) + rng.choice(["", ".", ",", "!"]) for _ in range(lines)]


def tensors(vocab, seed=5):
    """A random Llama (transformers' names) in GGUF's names and layout."""
    rng = np.random.default_rng(seed)
    hd = HIDDEN // HEADS
    r = lambda *s: (0.1 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    state = {"model.embed_tokens.weight": r(vocab, HIDDEN), "model.norm.weight": 1 + r(HIDDEN),
             "lm_head.weight": r(vocab, HIDDEN)}
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * hd, HIDDEN), "attn_v": (KV_HEADS * hd, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FF, HIDDEN), "ffn_up": (FF, HIDDEN),
              "ffn_down": (HIDDEN, FF)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = 1 + r(HIDDEN)
        state[p + "post_attention_layernorm.weight"] = 1 + r(HIDDEN)
        for g, hf in LINEARS.items():
            state[p + hf + ".weight"] = r(*shapes[g])
    return llama_tensors(state, HEADS, KV_HEADS, LAYERS)


def write_gguf(path, vocab, tokenizer):
    """A llama GGUF of `vocab` ids whose tokenizer.ggml.* are `tokenizer` (key suffix ->
    value; None: left out)."""
    w = gguf.GGUFWriter(path, arch="llama")
    for method, value in (("add_name", "tokenizer test"), ("add_context_length", 256),
                          ("add_embedding_length", HIDDEN), ("add_block_count", LAYERS),
                          ("add_feed_forward_length", FF), ("add_head_count", HEADS), ("add_head_count_kv", KV_HEADS),
                          ("add_layer_norm_rms_eps", 1e-5), ("add_vocab_size", vocab),
                          ("add_rope_dimension_count", HIDDEN // HEADS), ("add_file_type", 0)):
        getattr(w, method)(value)
    methods = {"model": "add_tokenizer_model", "pre": "add_tokenizer_pre", "tokens": "add_token_list",
               "scores": "add_token_scores", "token_type": "add_token_types", "merges": "add_token_merges",
               "bos_token_id": "add_bos_token_id", "eos_token_id": "add_eos_token_id",
               "unknown_token_id": "add_unk_token_id", "add_bos_token": "add_add_bos_token",
               "add_eos_token": "add_add_eos_token"}
    for key, value in tokenizer.items():
        if value is not None:
            getattr(w, methods[key])(value)
    for name, x in tensors(vocab).items():
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------- SentencePiece ("llama")
def spm_metadata(model_file):
    """What convert_hf_to_gguf.py (_create_vocab_sentencepiece, SpecialVocab) writes for a
    Llama tokenizer.model: every piece, its score and type; pre "default"; unk / bos / eos;
    add_bos_token true and add_eos_token false (Llama's tokenizer_config.json)."""
    import sentencepiece as sp

    t = sp.SentencePieceProcessor(model_file=model_file)
    types = [2 if t.is_unknown(i) else 3 if t.is_control(i) else 5 if t.is_unused(i) else 6 if t.is_byte(i) else 1
             for i in range(t.get_piece_size())]
    return {"model": "llama", "pre": "default", "tokens": [t.id_to_piece(i) for i in range(t.get_piece_size())],
            "scores": [float(t.get_score(i)) for i in range(t.get_piece_size())], "token_type": types,
            "bos_token_id": t.bos_id(), "eos_token_id": t.eos_id(), "unknown_token_id": t.unk_id(),
            "add_bos_token": True, "add_eos_token": False}


def make(out):
    import sentencepiece as sp

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    with open(os.path.join(out, "corpus.txt"), "w") as f:
        f.write("\n".join(corpus(rng)) + "\n")
    # Llama's tokenizer.model: BPE, byte fallback, no normalization, spaces kept, digits split.
    sp.SentencePieceTrainer.train(input=os.path.join(out, "corpus.txt"), model_prefix=os.path.join(out, "original"),
                                  vocab_size=PIECES, model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                  normalization_rule_name="identity", remove_extra_whitespaces=False,
                                  add_dummy_prefix=True, split_digits=True, allow_whitespace_only_pieces=True,
                                  unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    write_gguf(os.path.join(out, "spm.gguf"), PIECES, spm_metadata(os.path.join(out, "original.model")))
    print(f"make: a {PIECES}-piece SentencePiece BPE with byte fallback, in {out}/spm.gguf")


def stem(spec):
    return os.path.splitext(os.path.abspath(spec))[0]


def spm(out, spec):
    import sentencepiece as sp
    import tokenizers
    from transformers import LlamaTokenizerFast

    orig = sp.SentencePieceProcessor(model_file=os.path.join(out, "original.model"))
    mine = sp.SentencePieceProcessor(model_file=stem(spec) + ".tokenizer.model")
    n = orig.get_piece_size()
    assert mine.get_piece_size() == n, (mine.get_piece_size(), n)
    for i in range(n):
        a = (orig.id_to_piece(i), orig.get_score(i), orig.is_control(i), orig.is_byte(i), orig.is_unknown(i))
        b = (mine.id_to_piece(i), mine.get_score(i), mine.is_control(i), mine.is_byte(i), mine.is_unknown(i))
        assert a == b, (i, a, b)
    assert (mine.bos_id(), mine.eos_id(), mine.unk_id(), mine.pad_id()) == (1, 2, 0, -1)
    fast = LlamaTokenizerFast(vocab_file=os.path.join(out, "original.model"))  # converted from the slow one
    js = tokenizers.Tokenizer.from_file(stem(spec) + ".tokenizer.json")
    for t in TEXTS:
        ids = orig.encode(t)
        if mine.encode(t) != ids or mine.decode(ids) != orig.decode(ids):
            raise SystemExit(f"{t!r}: sentencepiece with the written model gives {mine.encode(t)}, the original {ids}")
        want = fast(t).input_ids
        got = js.encode(t).ids
        if got != want:
            raise SystemExit(f"{t!r}: the written tokenizer.json gives {got}, LlamaTokenizerFast {want}")
        text = js.decode(got, skip_special_tokens=True)
        if text != t or text != fast.decode(want, skip_special_tokens=True):
            raise SystemExit(f"{t!r}: the written tokenizer.json decodes {text!r}, LlamaTokenizerFast "
                             f"{fast.decode(want, skip_special_tokens=True)!r}")
        print(f"{t!r}: {len(ids)} pieces, sentencepiece and tokenizers equal to the original's")
    bytes_used = {i for t in TEXTS for i in orig.encode(t) if orig.is_byte(i)}
    assert bytes_used, "no text fell back to bytes"
    print(f"spm: {len(TEXTS)} texts ({len(bytes_used)} byte pieces used): the written files tokenize as the original")


def text(out, spec, binary):
    import sentencepiece as sp

    model = stem(spec) + ".tokenizer.model"
    tok = sp.SentencePieceProcessor(model_file=model)
    texts = [t for t in TEXTS if t.strip()]
    cmd = [binary, "--weights", stem(spec) + ".safetensors", "--spm", model, "--json", "--max-new-tokens", "2"]
    for t in texts:
        cmd += ["--text", t]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr}")
    rows = json.loads(r.stdout)["sequences"]
    for t, row in zip(texts, rows):
        want = [1] + tok.encode(t)
        if row["source"] != want:
            raise SystemExit(f"{t!r}: the binary's ids {row['source']}, sentencepiece's {want}")
    header = open(spec).read()
    assert f"--spm {model} --text" in header and f'tokenizer="{stem(spec)}.tokenizer.json"' in header, header
    print(f"text: {len(texts)} texts through --spm {os.path.basename(model)}: bos + sentencepiece's ids")


# ---------------------------------------------------------------- byte-level BPE ("gpt2")
def train_bpe(pre, lines):
    """A byte-level BPE trained now, shaped as the family's tokenizer.json (GPT-2, Qwen2,
    Llama 3); its special tokens first."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    specials = {"gpt-2": ["<|endoftext|>"], "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                "llama-bpe": ["<|begin_of_text|>", "<|end_of_text|>"]}[pre]
    if pre == "gpt-2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2 if pre == "qwen2" else LLAMA3), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=PIECES, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    if pre == "llama-bpe":
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", 0)])
    return tok, specials


def bpe_metadata(tok, specials, pre):
    """convert_hf_to_gguf.py's get_vocab_base + SpecialVocab: the tokens by id (special ones
    CONTROL), the merges of tokenizer.json, bos / eos."""
    n = tok.get_vocab_size()
    tokens = [tok.id_to_token(i) for i in range(n)]
    eos = tok.token_to_id("<|end_of_text|>" if pre == "llama-bpe" else "<|endoftext|>")
    bos = tok.token_to_id("<|begin_of_text|>") if pre == "llama-bpe" else eos
    return {"model": "gpt2", "pre": pre, "tokens": tokens, "token_type": [3 if t in specials else 1 for t in tokens],
            "merges": json.loads(tok.to_str())["model"]["merges"], "bos_token_id": bos, "eos_token_id": eos}


def bpe(halformer, out):
    import tokenizers

    work = os.path.join(out, "bpe")
    os.makedirs(work, exist_ok=True)
    lines = corpus(np.random.default_rng(8)) + ["it's what we'll do, don't you think?", "Qwen2 <|im_start|>"]
    for pre in ("gpt-2", "qwen2", "llama-bpe"):
        tok, specials = train_bpe(pre, lines)
        meta = bpe_metadata(tok, specials, pre)
        gpath, spec = os.path.join(work, f"{pre}.gguf"), os.path.join(work, f"{pre}.yaml")
        write_gguf(gpath, len(meta["tokens"]), meta)
        r = subprocess.run([halformer, "import", gpath, "-o", spec, "--force"], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"{pre}: import failed:\n{r.stdout}{r.stderr}")
        assert not os.path.exists(stem(spec) + ".tokenizer.model"), "a SentencePiece model for a byte-level BPE"
        assert "the binary has no byte-level BPE" in open(spec).read() and "byte-level BPE" in r.stdout, r.stdout
        mine = tokenizers.Tokenizer.from_file(stem(spec) + ".tokenizer.json")
        for t in TEXTS + ["<|endoftext|> special tokens <|im_end|> stay whole", "we'LL SEE"]:
            want, got = tok.encode(t).ids, mine.encode(t).ids
            if got != want:
                raise SystemExit(f"{pre}: {t!r}: the written tokenizer.json gives {got}, the original {want}")
            back = mine.decode(got)
            if back != tok.decode(want) or ("<|" not in t and back != t):
                raise SystemExit(f"{pre}: {t!r}: decodes to {back!r}")
        print(f"bpe {pre}: {len(meta['merges'])} merges, {len(TEXTS) + 2} texts: the original's ids, decoded back")


# ---------------------------------------------------------------- refusals and notices
# case: (metadata changes, expected regex; "notice:" for a successful import that writes no
# tokenizer, "exists" for an output that must not be replaced). Changes: key -> value
# (None: drop), or a function of the metadata.
def _types(f):
    return lambda m: {**m, "token_type": f(list(m["token_type"]))}


REFUSALS = {
    "tokens_length": (lambda m: {**m, "tokens": m["tokens"][:-1]},
                      r"key 'tokenizer.ggml.tokens': 399 tokens for a vocabulary of 400"),
    "scores_length": (lambda m: {**m, "scores": m["scores"] + [0.0]},
                      r"key 'tokenizer.ggml.scores': 401 entries for a vocabulary of 400"),
    "scores_missing": ({"scores": None}, r"key 'tokenizer.ggml.scores': missing \(required"),
    "types_length": (_types(lambda t: t[:10]), r"key 'tokenizer.ggml.token_type': 10 entries for a vocabulary of 400"),
    "type_value": (_types(lambda t: t[:5] + [9] + t[6:]), r"key 'tokenizer.ggml.token_type': token 5 has type 9"),
    "no_unknown": (_types(lambda t: [1] + t[1:]), r"key 'tokenizer.ggml.token_type': no unknown token"),
    "bytes_missing": (_types(lambda t: [1 if i == 3 + 65 else x for i, x in enumerate(t)]),
                      r"key 'tokenizer.ggml.token_type': 255 byte tokens \(type 6\): byte fallback needs all 256"),
    "unknown_id": ({"unknown_token_id": PIECES}, r"key 'tokenizer.ggml.unknown_token_id': found 400; not a token id"),
    "duplicate": (lambda m: {**m, "tokens": m["tokens"][:300] + [m["tokens"][299]] + m["tokens"][301:]},
                  r"key 'tokenizer.ggml.tokens': tokens 299 and 300 are both"),
    "merges_unknown": (lambda m: {"model": "gpt2", "pre": "gpt-2", "tokens": m["tokens"], "token_type": [1] * PIECES,
                                  "merges": ["@@x y"], "bos_token_id": 1, "eos_token_id": 2},
                       r"key 'tokenizer.ggml.merges': merge 0 '@@x y' names '@@x', not a token"),
    "tokenizer_exists": ({}, r"exists; add --force to replace it"),
    "model_bert": ({"model": "bert"}, r"notice:tokenizer.ggml.model 'bert': no tokenizer files written"),
    "pre_unknown": (lambda m: {"model": "gpt2", "pre": "deepseek-coder", "tokens": m["tokens"],
                               "bos_token_id": 1, "eos_token_id": 2},
                    r"notice:tokenizer.ggml.pre 'deepseek-coder': no tokenizer.json written"),
}


def refuse(case, halformer, out):
    changes, regex = REFUSALS[case]
    work = os.path.join(out, "refuse", case)
    os.makedirs(work, exist_ok=True)
    for name in os.listdir(work):
        os.remove(os.path.join(work, name))
    meta = spm_metadata(os.path.join(out, "original.model"))
    meta = changes(meta) if callable(changes) else {**meta, **changes}
    gpath, spec = os.path.join(work, "model.gguf"), os.path.join(work, "model.yaml")
    write_gguf(gpath, PIECES, meta)
    before = {}
    if case == "tokenizer_exists":
        before[stem(spec) + ".tokenizer.json"] = "mine\n"
        with open(stem(spec) + ".tokenizer.json", "w") as f:
            f.write("mine\n")
    r = subprocess.run([halformer, "import", gpath, "-o", spec], capture_output=True, text=True)
    outputs = [stem(spec) + e for e in (".yaml", ".safetensors", ".tokenizer.model", ".tokenizer.json")]
    if regex.startswith("notice:"):
        if r.returncode or not re.search(regex[7:], r.stdout) or any(os.path.exists(p) for p in outputs[2:]):
            raise SystemExit(f"{case}: expected an import with the notice {regex[7:]!r} and no tokenizer files, got "
                             f"exit {r.returncode}:\n{r.stdout}{r.stderr}\n{os.listdir(work)}")
        assert "# Tokenizer: " in open(spec).read()
        print(f"{case}: imported, no tokenizer files, notice: {r.stdout.splitlines()[0]}")
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compare import expect_refused

    expect_refused(case, r, regex, outputs, work, before)


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "make" and len(argv) == 3:
        make(argv[2])
    elif cmd == "spm" and len(argv) == 4:
        spm(argv[2], argv[3])
    elif cmd == "bpe" and len(argv) == 4:
        bpe(argv[2], argv[3])
    elif cmd == "text" and len(argv) == 5:
        text(argv[2], argv[3], argv[4])
    elif cmd == "refuse" and len(argv) == 5:
        refuse(*argv[2:5])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
