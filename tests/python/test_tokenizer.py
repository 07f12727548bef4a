"""Text in and out through a Hugging Face `tokenizers.Tokenizer` (issue 15, item 4):
halformer.Model(..., tokenizer=...) on the imported Llama checkpoint (ctest fixtures
import_hf_llama, import_model_llama), against transformers' generate() on the same
weights with the same tokenizer's ids and decode."""
import json
import os
import pathlib
import sys

import pytest

from conftest import BUILD, SOURCE

HF = BUILD / "import" / "hf" / "llama"
MODEL_DIR = BUILD / "import" / "llama" / "model"
VOCAB = 1003


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """A word-level tokenizer over the checkpoint's 1003 ids: "<unk>" 0, "<s>" 1 (added in
    front, as Llama's tokenizer adds bos), "</s>" 2, then "w3" ... "w1002"."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def model(tokenizer_json):
    import halformer

    if not (MODEL_DIR / "libimported-llama.so").is_file():
        pytest.fail(f"{MODEL_DIR} has no libimported-llama.so: ctest fixture import_model_llama")
    return halformer.Model(MODEL_DIR, weights=HF / "model.safetensors", tokenizer=str(tokenizer_json))


@pytest.fixture(scope="module")
def reference():
    sys.path.insert(0, str(SOURCE / "tests" / "import"))
    import check_import

    return check_import.llama_reference(str(HF))


PROMPTS = ["w5 w17 w300", "w999 w3", "w42"]


def test_generate_text_equals_transformers(model, reference):
    import torch

    tok = model.tokenizer
    got = model.generate(PROMPTS, max_new_tokens=10)
    assert isinstance(got, list) and all(isinstance(t, str) for t in got)
    for prompt, text in zip(PROMPTS, got):
        ids = torch.tensor([tok.encode(prompt).ids])
        assert ids[0, 0].item() == 1  # the post-processor's bos
        with torch.no_grad():
            gen = reference.generate(ids, max_new_tokens=10, do_sample=False, num_beams=1, pad_token_id=2,
                                     attention_mask=torch.ones_like(ids))
        want = tok.decode(gen[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
        assert text == want, f"{prompt!r}: {text!r}, transformers + tokenizer: {want!r}"
        assert text and all(w.startswith("w") for w in text.split())
    # one str in, one str out; the ids path gives the same tokens
    assert model.generate(PROMPTS[0], max_new_tokens=10) == got[0]
    ids = [tok.encode(p).ids for p in PROMPTS]
    assert model._text(model.generate(ids, max_new_tokens=10)) == got


def test_text_everywhere_ids_go(model):
    import numpy as np

    ids = [model.tokenizer.encode(p).ids for p in PROMPTS]
    assert np.array_equal(model.score(PROMPTS), model.score(ids))
    scored = model.generate(PROMPTS[:1], max_new_tokens=5, return_scores=True)[0]
    assert scored["text"] == model.tokenizer.decode(scored["tokens"], skip_special_tokens=True)
    assert len(scored["log_probs"]) == len(scored["tokens"])
    streamed = [t for _, t in model.generate_iter(PROMPTS[1], max_new_tokens=6)]
    assert streamed == model.generate([ids[1]], max_new_tokens=6)[0]


def test_tokenizer_errors(tokenizer_json, tmp_path):
    import halformer

    weights = HF / "model.safetensors"
    plain = halformer.Model(MODEL_DIR, weights=weights)
    with pytest.raises(TypeError, match="got str; text needs a tokenizer"):
        plain.generate("w5 w17", max_new_tokens=2)
    with pytest.raises(FileNotFoundError, match="tokenizer .*no such file"):
        halformer.Model(MODEL_DIR, weights=weights, tokenizer=str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(ValueError, match="is not a tokenizers JSON file"):
        halformer.Model(MODEL_DIR, weights=weights, tokenizer=str(bad))
    with pytest.raises(TypeError, match="tokenizer must be a tokenizers.Tokenizer"):
        halformer.Model(MODEL_DIR, weights=weights, tokenizer=42)
    # A text longer than max_len: the runtime's error, naming the sequence and the limit.
    m = halformer.Model(MODEL_DIR, weights=weights, tokenizer=str(tokenizer_json))
    with pytest.raises(ValueError, match="max_len is 160"):
        m.generate(" ".join(["w7"] * 200), max_new_tokens=2)
