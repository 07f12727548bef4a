"""halformer.import_model (python/halformer/building.py): the CLI's `halformer import` from
Python, on the GGUF test file (tests/import): the spec, weights and tokenizer it writes
are the CLI's own (byte for byte, once the paths in the spec's comments are the same), the
model built from them loads, and bad calls raise naming the problem."""
import os
import subprocess

import pytest

import halformer

BUILD = os.environ.get("HALFORMER_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
GGUF_DIR = os.path.join(BUILD, "import", "gguf")


def test_gguf_spec_equals_the_cli(tmp_path):
    src = os.path.join(GGUF_DIR, "q8.gguf")
    spec = halformer.import_model(src, tmp_path / "gguf-q8.yaml")
    assert spec == tmp_path / "gguf-q8.yaml"
    cli_dir = os.path.join(GGUF_DIR, "q8")
    for suffix in (".yaml", ".safetensors", ".tokenizer.json"):
        mine, cli = tmp_path / f"gguf-q8{suffix}", os.path.join(cli_dir, f"gguf-q8{suffix}")
        a, b = mine.read_bytes(), open(cli, "rb").read()
        if suffix == ".yaml":
            a = a.replace(str(tmp_path).encode(), cli_dir.encode())
        assert a == b, suffix
    # An existing output is kept unless force=True.
    with pytest.raises(subprocess.CalledProcessError) as e:
        halformer.import_model(src, spec)
    assert "--force" in e.value.output
    halformer.import_model(src, spec, force=True, name="renamed")
    assert "name: renamed" in spec.read_text()


def test_bad_calls(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such.gguf"):
        halformer.import_model(tmp_path / "no-such.gguf", tmp_path / "x.yaml")
    with pytest.raises(TypeError, match="name"):
        halformer.import_model(os.path.join(GGUF_DIR, "q8.gguf"), tmp_path / "x.yaml", name=7)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUG" + bytes(60))
    with pytest.raises(subprocess.CalledProcessError) as e:
        halformer.import_model(bad, tmp_path / "bad.yaml")
    assert "magic" in e.value.output
