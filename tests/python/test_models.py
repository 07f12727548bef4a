"""halformer.Model against the models' own inference binaries (the CLI is the reference:
it is checked against PyTorch by the golden tests). Greedy / beam / scores as the CLI
prints them; encode / score / pooled bit-for-bit equal to the CLI's --dump tensors;
generate_iter equal to generate; seeded sampling reproducible across runs and thread
counts, and equal to the CLI's."""
import json
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file

import halformer
from conftest import SOURCE, parse_ids, src_args

REVERSE_SRC = [[3, 7, 1, 9], [5, 4, 3, 2, 1, 13], [2, 2], [13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2]]
REVERSE_TGT = [[14, 9, 1, 7], [14, 13, 1], [14, 2, 2, 15], [14]]
GPT_SRC = [[5, 9, 13], [100, 200, 300, 400, 7], [1]]
BERT_SRC = [[2, 17, 30, 4, 3], [2, 5, 3], [2, 9, 9, 9, 9, 9, 9, 3]]


def test_config(reverse_tiny, gpt_tiny):
    c = reverse_tiny.model().config
    assert (c["name"], c["arch"], c["src_vocab"], c["tgt_vocab"], c["max_len"]) == ("reverse-tiny", "encoder_decoder", 16, 16, 64)
    assert (c["bos_id"], c["eos_id"], c["pad_id"], c["max_new_tokens"], c["head"]) == (14, 15, 0, 20, "log_softmax")
    assert gpt_tiny.model().config["arch"] == "decoder"


def test_reverse_greedy_equals_cli(reverse_tiny):
    m = reverse_tiny.model()
    expected = parse_ids(reverse_tiny.cli(*src_args(REVERSE_SRC), "--beam", 1))
    assert expected[0] == [9, 1, 7, 3, 15]
    assert m.generate(REVERSE_SRC) == expected
    assert [m.generate([s])[0] for s in REVERSE_SRC] == expected  # one at a time
    assert m.generate(REVERSE_SRC, max_new_tokens=3) == parse_ids(
        reverse_tiny.cli(*src_args(REVERSE_SRC), "--beam", 1, "--max-new-tokens", 3))
    # a padded numpy batch with lengths= is the same batch
    padded = np.zeros((len(REVERSE_SRC), 12), np.int64)
    for i, s in enumerate(REVERSE_SRC):
        padded[i, :len(s)] = s
    assert m.generate(padded[:1, :4]) == expected[:1]
    assert m.encode(padded, lengths=[len(s) for s in REVERSE_SRC]).tobytes() == m.encode(REVERSE_SRC).tobytes()


def test_gpt_greedy_equals_cli(gpt_tiny):
    m = gpt_tiny.model()
    for n in (None, 5):
        extra = [] if n is None else ["--max-new-tokens", n]
        assert m.generate(GPT_SRC, max_new_tokens=n) == parse_ids(gpt_tiny.cli(*src_args(GPT_SRC), *extra))


def test_beam_and_scores_equal_cli(reverse_tiny):
    m = reverse_tiny.model()
    j = json.loads(reverse_tiny.cli(*src_args(REVERSE_SRC), "--beam", 3, "--json"))
    best = [s["hypotheses"][0] for s in j["sequences"]]
    assert m.generate(REVERSE_SRC, beam_size=3) == [h["tokens"] for h in best]
    r = m.generate(REVERSE_SRC, beam_size=3, return_scores=True)
    assert [x["tokens"] for x in r] == [h["tokens"] for h in best]
    assert [x["score"] for x in r] == [h["score"] for h in best]
    j = json.loads(reverse_tiny.cli(*src_args(REVERSE_SRC), "--beam", 1, "--json", "--scores"))
    r = m.generate(REVERSE_SRC, return_scores=True)
    assert [x["tokens"] for x in r] == [s["tokens"] for s in j["sequences"]]
    assert [x["log_probs"] for x in r] == [s["token_logprobs"] for s in j["sequences"]]


def dump(built, tmp_path, *args):
    path = tmp_path / f"{built.name}.safetensors"
    built.cli(*args, "--dump", path)
    return load_file(str(path))


def same(a, b):
    """Bit-for-bit: shape, dtype and bytes."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_dump_tensors_bit_exact(reverse_tiny, gpt_tiny, bert_classifier, tmp_path):
    m = reverse_tiny.model()
    d = dump(reverse_tiny, tmp_path, *src_args(REVERSE_SRC), *(x for t in REVERSE_TGT for x in ("--tgt", " ".join(map(str, t)))))
    assert same(m.encode(REVERSE_SRC), d["encoder_output"])
    assert same(m.score(REVERSE_SRC, REVERSE_TGT), d["logits"])
    g = gpt_tiny.model()
    d = dump(gpt_tiny, tmp_path, *src_args(GPT_SRC))
    assert same(g.score(GPT_SRC), d["logits"])
    b = bert_classifier.model()
    d = dump(bert_classifier, tmp_path, *src_args(BERT_SRC))
    assert same(b.encode(BERT_SRC), d["encoder_output"])
    assert same(b.pooled(BERT_SRC), d["head_output"])
    assert b.pooled(BERT_SRC).shape == (3, b.config["num_classes"])


def tokens_by_row(stream, rows):
    out = [[] for _ in range(rows)]
    for row, token in stream:
        out[row].append(token)
    return out


def test_generate_iter_equals_generate(reverse_tiny, gpt_tiny):
    m = reverse_tiny.model()
    assert tokens_by_row(m.generate_iter(REVERSE_SRC), len(REVERSE_SRC)) == m.generate(REVERSE_SRC)
    g = gpt_tiny.model()
    opts = dict(max_new_tokens=12, sampling_topk=0, sampling_temperature=1.3, seed=11, repetition_penalty=1.2)
    assert tokens_by_row(g.generate_iter(GPT_SRC, **opts), len(GPT_SRC)) == g.generate(GPT_SRC, **opts)
    # with return_scores each token comes with its log-probability: generate()'s, bit for bit
    scored = [{"tokens": [], "log_probs": []} for _ in GPT_SRC]
    for row, token, lp in g.generate_iter(GPT_SRC, return_scores=True, **opts):
        scored[row]["tokens"].append(token)
        scored[row]["log_probs"].append(lp)
    expected = g.generate(GPT_SRC, return_scores=True, **opts)
    assert [s["tokens"] for s in scored] == [e["tokens"] for e in expected]
    assert [s["log_probs"] for s in scored] == [list(e["log_probs"]) for e in expected]
    assert all(lp <= 0 for s in scored for lp in s["log_probs"])
    # closing early stops the background generation (and does not hang)
    it = g.generate_iter(GPT_SRC, max_new_tokens=40)
    first = [next(it), next(it)]
    it.close()
    assert first[0][0] == 0


def test_sampling_reproducible(gpt_tiny, reverse_tiny):
    opts = dict(max_new_tokens=16, sampling_topk=0, sampling_topp=0.95, sampling_temperature=1.5, seed=1234)
    one, two = gpt_tiny.model(threads=1), gpt_tiny.model(threads=2)
    a = one.generate(GPT_SRC, **opts)
    assert a == one.generate(GPT_SRC, **opts) == two.generate(GPT_SRC, **opts)
    # each row's draws depend on (seed, row), not on the rest of the batch
    assert [one.generate([s], **opts)[0] for s in GPT_SRC[:1]] == a[:1]
    # the CLI with the same options
    cli = gpt_tiny.cli(*src_args(GPT_SRC), "--max-new-tokens", 16, "--sampling-topk", 0, "--sampling-topp", 0.95,
                       "--temperature", 1.5, "--seed", 1234)
    assert a == parse_ids(cli)
    others = [one.generate(GPT_SRC, **dict(opts, seed=s)) for s in (1, 2, 3)]
    assert any(o != a for o in others), "different seeds should sample differently"
    r = reverse_tiny.model(threads=2)
    ropts = dict(sampling_topk=4, sampling_temperature=2.0, seed=5, min_length=3, no_repeat_ngram_size=2)
    assert r.generate(REVERSE_SRC, **ropts) == reverse_tiny.model(threads=1).generate(REVERSE_SRC, **ropts)


def test_callback_exception_propagates(reverse_tiny):
    m = reverse_tiny.model()

    class Stop(Exception):
        pass

    def boom(row, token):
        raise Stop(f"row {row}")

    ids, offsets = halformer._pack([[3, 7, 1, 9]])
    with pytest.raises(Stop, match="row 0"):
        m._m.generate(ids, offsets, halformer._native.GenerationOptions(), boom)
    assert m.generate([[3, 7, 1, 9]]) == [[9, 1, 7, 3, 15]]  # still usable


def test_build_runs_the_cli(tmp_path, capsys):
    out = halformer.build(SOURCE / "models" / "reverse-tiny.yaml", tmp_path / "rt")
    assert (out / "libreverse-tiny.so").is_file() and (out / "reverse-tiny").is_file()
    assert "[halformer] built" in capsys.readouterr().out  # streamed through sys.stdout
    weights = SOURCE / "models" / "reverse-tiny.safetensors"
    m = halformer.Model(out, weights=weights)
    assert m.generate([[3, 7, 1, 9]]) == [[9, 1, 7, 3, 15]]
    # rebuilt in place with another spec: a new Model in this process sees the new build
    spec = tmp_path / "reverse-tiny.yaml"
    spec.write_text((SOURCE / "models" / "reverse-tiny.yaml").read_text().replace("max_new_tokens: 20", "max_new_tokens: 3"))
    halformer.build(spec, out)
    m3 = halformer.Model(out, weights=weights)
    assert m3.config["max_new_tokens"] == 3 and m3.config["spec_file"] == str(spec)
    assert m3.generate([[3, 7, 1, 9]]) == [[9, 1, 7]]
    assert m.generate([[3, 7, 1, 9]]) == [[9, 1, 7, 3, 15]]  # the first build, still loaded
    assert halformer.Model(out, weights=weights).config["max_new_tokens"] == 3
    with pytest.raises(subprocess.CalledProcessError) as e:
        halformer.build(SOURCE / "tests" / "tools" / "spec" / "broken" / "heads_not_divisor.yaml", tmp_path / "broken")
    assert "heads" in e.value.output


def test_build_reduced_precision(tmp_path):
    # The same weights file, converted at load (docs/precision.md); the trained model still
    # reverses its input (its held-out exact match is tests/models/check_reverse_accuracy.py's).
    weights = SOURCE / "models" / "reverse-tiny.safetensors"
    out = halformer.build(SOURCE / "models" / "reverse-tiny.yaml", tmp_path / "rt-int8", precision="int8")
    assert "# precision: int8" in (out / ".halformer" / "CMakeLists.txt").read_text()
    assert halformer.Model(out, weights=weights).generate([[3, 7, 1, 9]]) == [[9, 1, 7, 3, 15]]
