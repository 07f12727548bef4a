"""Shared pieces of the `halformer` Python package tests (tests/python/CMakeLists.txt runs
each file under ctest, label python, with PYTHONPATH=build/python).

Where things are (environment, defaults for a plain `pytest tests/python` run from the
repository with build/ made and the model fixtures built):
  HALFORMER_SOURCE_DIR   the repository                 (default: two levels up)
  HALFORMER_BUILD_DIR    the CMake build directory      (default: <source>/build)
  HALFORMER_MODELS_DIR   the built model directories    (default: <build>/models)
The reference weights of the random-weight models come from <build>/models/<name>/reference
(the reference_<name> fixtures)."""
import os
import pathlib
import subprocess

import pytest

SOURCE = pathlib.Path(os.environ.get("HALFORMER_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD = pathlib.Path(os.environ.get("HALFORMER_BUILD_DIR", SOURCE / "build"))
MODELS = pathlib.Path(os.environ.get("HALFORMER_MODELS_DIR", BUILD / "models"))


class Built:
    """A built model: its directory, name, weights; cli(...) runs its inference binary."""

    def __init__(self, name, weights, directory=None):
        self.name, self.dir, self.weights = name, MODELS / (directory or name), str(weights)
        if not (self.dir / f"lib{name}.so").is_file():
            pytest.fail(f"{self.dir}/lib{name}.so is missing: build the model (ctest fixture model_{name})")
        if not os.path.isfile(self.weights):
            pytest.fail(f"{self.weights} is missing (ctest fixture reference_{name})")

    def model(self, **kw):
        import halformer
        return halformer.Model(self.dir, weights=self.weights, **kw)

    def cli(self, *args):
        """The binary's stdout for `DIR/<name> --weights W ARGS...` (must succeed)."""
        r = subprocess.run([str(self.dir / self.name), "--weights", self.weights, *map(str, args)],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{self.name} {' '.join(map(str, args))}: {r.stderr}"
        return r.stdout


@pytest.fixture(scope="session")
def reverse_tiny():
    return Built("reverse-tiny", SOURCE / "models" / "reverse-tiny.safetensors")


@pytest.fixture(scope="session")
def gpt_tiny():
    return Built("gpt-tiny", BUILD / "models" / "gpt-tiny" / "reference" / "weights.safetensors")


@pytest.fixture(scope="session")
def gpt_tied_kv8():
    """gpt-tied built int8 with an int8 key/value cache (tests/models/CMakeLists.txt)."""
    return Built("gpt-tied", BUILD / "models" / "gpt-tied" / "reference" / "weights.safetensors", "gpt-tied-int8_kv8")


@pytest.fixture(scope="session")
def bert_classifier():
    return Built("bert-tiny-classifier",
                 BUILD / "models" / "bert-tiny-classifier" / "reference" / "weights.safetensors")


def src_args(batch):
    """--src "a b c" per sequence."""
    out = []
    for s in batch:
        out += ["--src", " ".join(map(str, s))]
    return out


def parse_ids(stdout):
    return [[int(t) for t in line.split()] for line in stdout.splitlines()]
