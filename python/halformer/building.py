"""halformer.build() and halformer.import_model(): a model from its YAML spec, and a spec
from a checkpoint, by running the project's `halformer build` / `halformer import` CLI
(the one of the source tree this package was built from, or $HALFORMER_TOOL)."""
import os
import pathlib
import subprocess
import sys

try:
    from ._build_info import HALFORMER_TOOL as _BUILT_TOOL
except ImportError:  # pragma: no cover - a package assembled by hand
    _BUILT_TOOL = None


def _tool():
    tool = os.environ.get("HALFORMER_TOOL") or _BUILT_TOOL
    if not tool or not os.path.isfile(tool):
        raise FileNotFoundError(
            f"the halformer CLI was not found at {tool!r}: build the project (cmake --build --preset default) "
            "or set HALFORMER_TOOL to the path of build/bin/halformer")
    return tool


PRECISIONS = ("fp32", "int8", "bf16", "q8_0", "int4")  # weight precisions of halformer/enums.h kPrecisionNames


def build(spec, out_dir, precision=None):
    """Builds the model of SPEC (a YAML file) into OUT_DIR with the halformer CLI:
    OUT_DIR/<name> (inference binary), lib<name>.so (for Model), lib<name>.a, <name>.h.
    precision: "fp32", "int8", "bf16", "q8_0" or "int4" instead of the spec's `precision:` (as
    `halformer build --precision`; docs/precision.md); None keeps the spec's.
    The CLI's output is streamed to sys.stdout; a failure raises
    subprocess.CalledProcessError (its .output holds what was printed). Returns OUT_DIR."""
    spec, out_dir = os.fspath(spec), os.fspath(out_dir)
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)} (or None: the spec's)")
    if not os.path.isfile(spec):
        raise FileNotFoundError(f"spec {spec!r}: no such file")
    _run_tool(["build", spec, "-o", out_dir] + (["--precision", precision] if precision else []))
    return pathlib.Path(out_dir)


def import_model(source, spec_out, name=None, weights_out=None, force=False):
    """Writes a spec for SOURCE -- a Hugging Face model directory (config.json and
    model.safetensors: BERT, GPT-2, Llama, T5, ...) or a llama.cpp GGUF file (llama, qwen2,
    gemma, gpt2; its weights and tokenizer written beside the spec, or the weights to
    weights_out) -- as `halformer import` does (docs/import.md); its quantized blocks are
    kept where a kernel reads them. Existing outputs are kept unless force=True. The CLI's
    output is streamed to sys.stdout; a failure raises subprocess.CalledProcessError (its
    .output says why). Returns the spec's path, ready for halformer.build()."""
    source, spec_out = os.fspath(source), os.fspath(spec_out)
    if not os.path.exists(source):
        raise FileNotFoundError(f"source {source!r}: no such file or directory")
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    cmd = ["import", source, "-o", spec_out] + (["--name", name] if name else [])
    if weights_out is not None:
        cmd += ["--weights-out", os.fspath(weights_out)]
    _run_tool(cmd + (["--force"] if force else []))
    return pathlib.Path(spec_out)


def _run_tool(args):
    """The halformer CLI with `args`, its output streamed to sys.stdout."""
    cmd = [_tool()] + args
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", bufsize=1) as p:
        for line in p.stdout:
            lines.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()
    if p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, cmd, output="".join(lines))
