#!/usr/bin/env python3
"""Export a PyTorch checkpoint to safetensors for the halformer runtime.

    python tools/export_torch.py IN.pt OUT.safetensors [--force]

IN is a torch.save'd state_dict or nn.Module (a dict holding the state dict under
"state_dict" or "model", as training scripts often save, is accepted too). Names are
written unchanged: a model built like halformer_torch.Seq2Seq (tests/reference) produces the
"torch.nn.Transformer" naming preset directly.

Design decisions:
* Floating tensors are written as contiguous float32 (the runtime's fp32 path); other
  tensors (e.g. integer buffers) are kept as they are, with a note.
* Tied weights (several names, one storage: shared embeddings / output projection) are
  cloned, because safetensors refuses shared storage; every name stays present so a
  loader can look up whichever it expects. A note lists them.
* OUT is never overwritten unless --force, and is written atomically: a temporary file
  in OUT's directory, then os.replace, so a crash never leaves a half-written file.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import OrderedDict
from typing import Dict, List, Tuple

import torch

# So that torch.load can unpickle a whole halformer_torch.Seq2Seq module (the PyTorch
# reference, tests/reference/halformer_torch).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "reference"))


class ExportError(Exception):
    pass


def prepare_tensors(state: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """Contiguous, unshared, float32 (when floating) copies of a state dict; plus notes."""
    notes: List[str] = []
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    by_storage: Dict[Tuple[int, int], List[str]] = {}
    for name, t in state.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise ExportError(f"entry {name!r} is a {type(t).__name__}, not a tensor")
        t = t.detach().cpu()
        if t.numel() > 0:
            by_storage.setdefault((t.storage().data_ptr(), t.storage().size()), []).append(name)
        if t.is_floating_point():
            if t.dtype != torch.float32:
                notes.append(f"{name}: {t.dtype} converted to float32")
            t = t.to(torch.float32)
        else:
            notes.append(f"{name}: {t.dtype} tensor kept as {t.dtype}")
        # clone(): never share memory with the input (or with another entry).
        out[name] = t.contiguous().clone()
    for names in by_storage.values():
        if len(names) > 1:
            notes.append("shared storage, written as separate copies: " + ", ".join(names))
    return out, notes


def load_state_dict(path: str) -> Dict[str, torch.Tensor]:
    if not os.path.isfile(path):
        raise ExportError(f"{path}: no such file")
    try:
        obj = torch.load(path, map_location="cpu")
    except Exception as e:  # pickle errors come in many types
        raise ExportError(f"{path}: cannot be read by torch.load: {e}") from e
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict()
    if isinstance(obj, dict):
        for key in ("state_dict", "model"):
            inner = obj.get(key)
            if isinstance(inner, torch.nn.Module):
                inner = inner.state_dict()
            if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                print(f"note: using the state dict stored under {key!r}")
                return inner
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj
        bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)][:5]
        raise ExportError(f"{path}: a dict but not a state dict (non-tensor entries: {bad})"
                          if obj else f"{path}: an empty dict, no tensors to export")
    raise ExportError(f"{path}: holds a {type(obj).__name__}, expected a state dict or nn.Module")


def save_atomic(tensors: Dict[str, torch.Tensor], out: str, force: bool) -> None:
    """safetensors.torch.save_file to `out` via a temp file + os.replace."""
    from safetensors.torch import save_file

    if os.path.exists(out) and not force:
        raise ExportError(f"{out}: already exists (use --force to overwrite)")
    directory = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(directory):
        raise ExportError(f"{directory}: output directory does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=directory)
    os.close(fd)
    try:
        save_file(tensors, tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give OUT the usual mode
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", metavar="IN", help="torch.save'd state_dict or nn.Module (.pt/.pth)")
    ap.add_argument("output", metavar="OUT", help="safetensors file to write")
    ap.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    args = ap.parse_args(argv)
    try:
        # Fail on the output before a slow load.
        if os.path.exists(args.output) and not args.force:
            raise ExportError(f"{args.output}: already exists (use --force to overwrite)")
        out_dir = os.path.dirname(os.path.abspath(args.output))
        if not os.path.isdir(out_dir):
            raise ExportError(f"{out_dir}: output directory does not exist")
        tensors, notes = prepare_tensors(load_state_dict(args.input))
        for n in notes:
            print("note:", n)
        save_atomic(tensors, args.output, args.force)
    except ExportError as e:
        print(f"export_torch: error: {e}", file=sys.stderr)
        return 1
    n = sum(t.numel() for t in tensors.values())
    print(f"wrote {args.output}: {len(tensors)} tensors, {n} values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
