"""Every bad input raises the right exception type with a message naming the problem:
FileNotFoundError (missing directory, library, weights), ValueError (values: the
runtime's halformer::Error messages, options out of range), TypeError (wrong types).
Nothing crashes the interpreter."""
import os
import shutil

import numpy as np
import pytest

import halformer
from conftest import SOURCE


@pytest.fixture(scope="module")
def rev(reverse_tiny):
    return reverse_tiny.model()


@pytest.fixture(scope="module")
def gpt(gpt_tiny):
    return gpt_tiny.model()


def test_load_errors(reverse_tiny, gpt_tiny, tmp_path):
    w = reverse_tiny.weights
    with pytest.raises(FileNotFoundError, match="no such directory"):
        halformer.Model(tmp_path / "nonexistent", weights=w)
    with pytest.raises(FileNotFoundError, match=r"has no lib<name>\.so"):
        halformer.Model(tmp_path, weights=w)
    with pytest.raises(FileNotFoundError, match="weights .*missing.safetensors.*no such file"):
        halformer.Model(reverse_tiny.dir, weights=tmp_path / "missing.safetensors")
    with pytest.raises(FileNotFoundError, match="is a directory"):
        halformer.Model(reverse_tiny.dir, weights=tmp_path)
    # the weights of another model: the runtime names the tensor that does not fit
    with pytest.raises(ValueError, match="reverse-tiny|src_embedding|expected|missing"):
        halformer.Model(reverse_tiny.dir, weights=gpt_tiny.weights)
    with pytest.raises(ValueError, match="safetensors|header|too small|cannot"):
        halformer.Model(reverse_tiny.dir, weights=SOURCE / "models" / "reverse-tiny.yaml")
    # not a model library
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "libfake.so").write_text("not an ELF file")
    with pytest.raises(ValueError, match="cannot load the model library"):
        halformer.Model(fake, weights=w)
    native = halformer._native.__file__
    with pytest.raises(ValueError, match="no halformer_model_descriptor"):
        halformer.Model(native, weights=w)
    two = tmp_path / "two"
    two.mkdir()
    for n in ("liba.so", "libb.so"):
        shutil.copy(reverse_tiny.dir / "libreverse-tiny.so", two / n)
    with pytest.raises(ValueError, match="several model libraries"):
        halformer.Model(two, weights=w)
    assert halformer.Model(two / "liba.so", weights=w).generate([[3, 7, 1, 9]]) == [[9, 1, 7, 3, 15]]
    with pytest.raises(ValueError, match="device 'cuda': this model was built for: cpu"):
        halformer.Model(reverse_tiny.dir, weights=w, device="cuda")
    with pytest.raises(TypeError, match="device must be a str"):
        halformer.Model(reverse_tiny.dir, weights=w, device=0)
    with pytest.raises(TypeError, match="threads must be an int"):
        halformer.Model(reverse_tiny.dir, weights=w, threads="2")


BATCH_CASES = [
    # (batch, kwargs, exception, message regex)
    ([[3, 99]], {}, ValueError, r"sequence 1, token 2: id 99 is outside the vocabulary \[0, 16\)"),
    ([[3, 4], [-1]], {}, ValueError, r"sequence 2, token 1: id -1 is outside the vocabulary"),
    ([[3, 2**40]], {}, ValueError, r"id 1099511627776 is outside the vocabulary"),
    ([], {}, ValueError, "empty batch"),
    (np.zeros((0, 4), np.int32), {}, ValueError, "empty batch"),
    ([[3], []], {}, ValueError, "sequence 2 is empty"),
    ([[3] * 65], {}, ValueError, r"has 65 tokens; the model's max_len is 64"),
    (np.array([[1, 2], [3]], dtype=object), {}, TypeError, "2-D integer array.*ragged"),
    (np.zeros((2, 3), np.float32), {}, TypeError, "2-D integer array.*float32"),
    (np.zeros((2, 3, 1), np.int32), {}, TypeError, "2-D integer array.*3-D"),
    (np.ones((2, 3), bool), {}, TypeError, "2-D integer array.*bool"),
    ([[3, 7.0]], {}, TypeError, r"sequence 1, token 2: token ids must be integers, got float"),
    ([[3, True]], {}, TypeError, r"token ids must be integers, got bool"),
    ([["3", "7"]], {}, TypeError, r"token ids must be integers, got str"),
    (["3 7"], {}, TypeError, r"sequence 1 must be a list of token ids.*str"),
    ([3, 7], {}, TypeError, "flat list of ints"),
    (None, {}, TypeError, "list of token-id lists or a 2-D integer numpy array, got NoneType"),
    ("3 7", {}, TypeError, "got str"),
    ([np.array([3.0])], {}, TypeError, "token ids must be integers, got a float64 array"),
    (np.ones((2, 4), np.int32), dict(lengths=[4]), ValueError, "1 lengths for 2 sequences"),
    (np.ones((2, 4), np.int32), dict(lengths=[4, 5]), ValueError, r"lengths\[1\] = 5 is outside \[0, 4\]"),
    (np.ones((2, 4), np.int32), dict(lengths=[4, 0]), ValueError, "sequence 2 is empty"),
    (np.ones((2, 4), np.int32), dict(lengths=[1.5, 2]), TypeError, "lengths must be a 1-D sequence of ints"),
    ([[3, 4]], dict(lengths=[2]), TypeError, "lengths= applies to a 2-D numpy batch"),
]


@pytest.mark.parametrize("batch,kw,exc,msg", BATCH_CASES)
def test_bad_batches(rev, batch, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        rev.encode(batch, **kw)
    if not kw:
        with pytest.raises(exc, match=msg):
            rev.generate(batch)


OPTION_CASES = [
    (dict(sampling_topp=1.5), ValueError, r"sampling_topp 1.5 is outside \(0, 1\]"),
    (dict(sampling_topp=0), ValueError, r"sampling_topp 0 is outside \(0, 1\]"),
    (dict(sampling_temperature=-1), ValueError, "sampling_temperature -1 is outside"),
    (dict(sampling_temperature=1e300), ValueError, r"sampling_temperature 1e\+300 is out of range"),
    (dict(sampling_temperature=float("nan")), ValueError, "sampling_temperature nan is outside"),
    (dict(sampling_topk=-2), ValueError, "sampling_topk -2 is outside"),
    (dict(repetition_penalty=0), ValueError, "repetition_penalty 0 is outside"),
    (dict(no_repeat_ngram_size=-1), ValueError, "no_repeat_ngram_size -1 is outside"),
    (dict(min_length=-3), ValueError, "min_length -3 is outside"),
    (dict(max_new_tokens=0), ValueError, r"max_new_tokens 0 is outside \[1, max_len = 64\]"),
    (dict(max_new_tokens=65), ValueError, r"max_new_tokens 65 is outside \[1, max_len = 64\]"),
    (dict(seed=-1), ValueError, r"seed -1 is outside \[0, 2\*\*64\)"),
    (dict(sampling_topk=2**40), ValueError, "sampling_topk 1099511627776 is out of range"),
    (dict(beam_size=0), ValueError, "beam_size 0 is outside"),
    (dict(beam_size=2, sampling_topk=5), ValueError, "beam search takes length_penalty and max_new_tokens; sampling_topk"),
    (dict(beam_size=2, min_length=1), ValueError, "min_length apply to greedy"),
    (dict(length_penalty=0.6), ValueError, "length_penalty applies to beam search"),
    (dict(beam_size=3, max_new_tokens=100), ValueError, r"max_new_tokens 100 is outside \[1, max_len = 64\]"),
    (dict(beam_size=3, length_penalty=float("inf")), ValueError, "length_penalty inf is not finite"),
    (dict(sampling_topp="0.5"), TypeError, "sampling_topp must be a number, got str"),
    (dict(sampling_temperature=None), TypeError, "sampling_temperature must be a number, got NoneType"),
    (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an int, got float"),
    (dict(beam_size="3"), TypeError, "beam_size must be an int, got str"),
    (dict(seed=1.0), TypeError, "seed must be an int"),
    (dict(return_scores="yes"), TypeError, "return_scores must be a bool"),
    (dict(beam_size=2, return_scores=1), TypeError, "return_scores must be a bool"),
    (dict(sampling_topk=True), TypeError, "sampling_topk must be an int, got bool"),
]


@pytest.mark.parametrize("kw,exc,msg", OPTION_CASES)
def test_bad_options(rev, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        rev.generate([[3, 7]], **kw)


def test_generate_iter_checks_eagerly(rev):
    with pytest.raises(ValueError, match="sampling_topp 1.5"):
        rev.generate_iter([[3, 7]], sampling_topp=1.5)  # raised by the call, not by next()
    with pytest.raises(ValueError, match="id 99 is outside"):
        rev.generate_iter([[99]])


def test_wrong_operation_for_the_model(rev, gpt, bert_classifier):
    with pytest.raises(ValueError, match="decoder-only model has no encoder"):
        gpt.encode([[5, 9]])
    with pytest.raises(ValueError, match="head is not 'classifier' or 'embedding'"):
        rev.pooled([[3, 7]])
    with pytest.raises(ValueError, match="beam search needs an encoder-decoder model"):
        gpt.generate([[5, 9]], beam_size=2)
    with pytest.raises(ValueError, match="needs tgt .*bos = 14"):
        rev.score([[3]])
    with pytest.raises(ValueError, match="tgt applies to encoder-decoder models"):
        gpt.score([[3]], [[1, 3]])
    with pytest.raises(ValueError, match="encoder-only model has no decoder"):
        bert_classifier.model().score([[2, 3]])
    with pytest.raises(ValueError, match="2 source sequences but 1"):
        rev.score([[3], [4]], [[14, 3]])
    with pytest.raises(ValueError, match=r"prompt 1: 120 tokens \+ 32 new tokens exceed max_len 128"):
        gpt.generate([[5] * 120])


def test_build_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="spec .*nope.yaml.*no such file"):
        halformer.build(tmp_path / "nope.yaml", tmp_path / "out")
    for bad in ("int2", "FP32", 8):
        with pytest.raises(ValueError, match=r"precision .*: expected one of fp32, int8, bf16, q8_0, int4"):
            halformer.build(SOURCE / "models" / "reverse-tiny.yaml", tmp_path / "out", precision=bad)
    monkeypatch.setenv("HALFORMER_TOOL", str(tmp_path / "no-halformer"))
    with pytest.raises(FileNotFoundError, match="halformer CLI was not found.*HALFORMER_TOOL"):
        halformer.build(SOURCE / "models" / "reverse-tiny.yaml", tmp_path / "out")
    assert not os.path.exists(tmp_path / "out")
