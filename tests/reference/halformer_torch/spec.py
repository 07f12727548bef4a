"""The spec as the PyTorch reference reads it: a YAML file with halformer::Spec's defaults
filled in. spec_defaults() is the one place those defaults come from, and it reads them
from the spec compiler (`halformer check --print-defaults`), not from a copy here."""
from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
from typing import Any, Dict, Sequence

import yaml

ARCHITECTURES = ("encoder_decoder", "encoder", "decoder")
PRESETS = ("torch.nn.Transformer", "annotated-transformer", "huggingface-bert")

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def halformer_cli() -> str:
    """The `halformer` program to ask for the defaults: $HALFORMER_CLI (the tests set it),
    else the default build's build/bin/halformer, else `halformer` on PATH."""
    env = os.environ.get("HALFORMER_CLI")
    if env:
        if not os.access(env, os.X_OK):
            raise RuntimeError(f"HALFORMER_CLI={env!r} is not an executable file (the halformer CLI)")
        return env
    built = os.path.join(_ROOT, "build", "bin", "halformer")
    if os.access(built, os.X_OK):
        return built
    on_path = shutil.which("halformer")
    if on_path:
        return on_path
    raise RuntimeError(
        "halformer_torch needs the halformer CLI to read the spec's defaults "
        "(`halformer check --print-defaults`): build it (cmake --build build --target halformer) "
        f"or set HALFORMER_CLI to its path (not found: $HALFORMER_CLI, {built}, halformer on PATH)")


@functools.lru_cache(maxsize=None)
def _printed_defaults(cli: str) -> Dict[str, Any]:
    run = subprocess.run([cli, "check", "--print-defaults"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True)
    if run.returncode != 0:
        raise RuntimeError(f"{cli} check --print-defaults failed (exit {run.returncode}): "
                           f"{run.stderr.strip()}")
    printed = json.loads(run.stdout)
    if not isinstance(printed.get("defaults"), dict) or not isinstance(printed.get("derived"), dict):
        raise RuntimeError(f"{cli} check --print-defaults: expected {{'defaults': ..., 'derived': ...}}")
    return printed


def spec_defaults() -> Dict[str, Any]:
    """The spec's defaults, as `halformer check --print-defaults` prints them (read from
    halformer::Spec, tools/spec/spec.h):

        architecture      the architecture of a spec that names none (Spec's; the spec
                          compiler requires one)
        by_architecture   {architecture: {section: {key: default}}}, filled in first: the
                          derived defaults the reference applies (attention.causal)
        sections          {section: {key: default}}, filled in after them
        top               {key: default}: the top-level fields (precision, targets, ...)

    Derived defaults the reference does not read (kv_heads, rotary_dim, ...) stay unset.
    """
    printed = copy.deepcopy(_printed_defaults(halformer_cli()))
    defaults, derived = printed["defaults"], printed["derived"]
    if "attention.causal" not in derived:
        raise RuntimeError("halformer check --print-defaults: no derived rule for attention.causal "
                           "(the reference expects: false for architecture encoder)")
    return {
        "architecture": "encoder_decoder",
        "by_architecture": {"encoder": {"attention": {"causal": False}}},
        "sections": {k: v for k, v in defaults.items() if isinstance(v, dict)},
        "top": {k: v for k, v in defaults.items() if not isinstance(v, dict)},
    }


def load_spec(path: str) -> Dict[str, Any]:
    """Reads a spec YAML file and fills in the defaults of halformer::Spec.

    Validation is the C++ side's job (halformer check); this only fails on what it needs.
    """
    with open(path, "r", encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a spec must be a YAML mapping")
    return apply_defaults(spec)


def _fill(spec: Dict[str, Any], sections: Dict[str, Dict[str, Any]]) -> None:
    for section, values in sections.items():
        for key, value in values.items():
            sec = spec.get(section)
            if sec is None:
                sec = spec[section] = {}
            sec.setdefault(key, value)


def apply_defaults(spec: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of `spec` with every field it leaves out set to its default."""
    defaults = spec_defaults()
    spec = copy.deepcopy(spec)
    spec.setdefault("architecture", defaults["architecture"])
    _fill(spec, defaults["by_architecture"].get(spec["architecture"], {}))
    _fill(spec, defaults["sections"])
    for key, value in defaults["top"].items():
        spec.setdefault(key, value)
    return spec


def _require(spec: Dict[str, Any], keys: Sequence[str]) -> None:
    s = spec.get("sizes") or {}
    missing = [k for k in keys if k not in s or (k in ("src_vocab", "tgt_vocab") and not s[k])]
    if missing:
        raise ValueError("spec is missing " + ", ".join("sizes." + k for k in missing))


def _checked_spec(spec: Dict[str, Any], who: str, architecture: str, required: Sequence[str]) -> Dict[str, Any]:
    """`spec` with its defaults filled in, after checking that `who` gets `architecture`
    and the `required` sizes."""
    spec = apply_defaults(spec)
    if spec["architecture"] != architecture:
        raise ValueError(f"{who} needs architecture {architecture}, got {spec['architecture']!r}")
    _require(spec, required)
    return spec
