"""Argument checks of the Python API: ints and floats of the options, token-id batches
(lists or numpy) packed into the flat form halformer._native reads, existing files. Each
raises TypeError for a wrong type and ValueError for a bad value, naming the argument."""
import math
import numbers
import os

import numpy as np


def _is_int(v):
    return isinstance(v, (numbers.Integral, np.integer)) and not isinstance(v, (bool, np.bool_))


def _int_arg(name, v, bits=None):
    """int(v); TypeError unless an integer, ValueError outside a signed `bits`-bit int."""
    if not _is_int(v):
        raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if bits and not -2**(bits - 1) <= v < 2**(bits - 1):
        raise ValueError(f"{name} {int(v)} is out of range (not a {bits}-bit int)")
    return int(v)


def _float_arg(name, v, float32=False):
    """float(v); TypeError unless a real number; ValueError if a float32 option overflows."""
    if not isinstance(v, (numbers.Real, np.floating, np.integer)) or isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number, got {type(v).__name__} {v!r}")
    if float32 and math.isfinite(v) and abs(v) > np.finfo(np.float32).max:
        raise ValueError(f"{name} {v} is out of range (not a 32-bit float)")
    return float(v)


def _int32_row(row, what):
    """One sequence as an int32 numpy array; TypeError unless it holds integers only."""
    if isinstance(row, np.ndarray):
        if row.ndim != 1:
            raise TypeError(f"{what} must be a flat sequence of token ids, got an array of shape {row.shape}")
        if row.dtype.kind not in "iu":
            raise TypeError(f"{what}: token ids must be integers, got a {row.dtype} array")
        lo, hi = (int(row.min()), int(row.max())) if row.size else (0, 0)
    else:
        if not isinstance(row, (list, tuple, range)):
            raise TypeError(f"{what} must be a list of token ids (ints), got {type(row).__name__}")
        for j, v in enumerate(row):
            if not _is_int(v):
                raise TypeError(f"{what}, token {j + 1}: token ids must be integers, got {type(v).__name__} {v!r}")
        lo, hi = (min(row), max(row)) if len(row) else (0, 0)
    if lo < -2**31 or hi >= 2**31:
        raise ValueError(f"{what}: id {lo if lo < -2**31 else hi} is outside the vocabulary (not a 32-bit id)")
    return np.asarray(row, dtype=np.int32)


def _pack(batch, lengths=None, what="batch"):
    """A batch -> (ids int32 [N], offsets int64 [B + 1]), the packed form _native reads.
    batch: a list (tuple) of sequences of ints, or a 2-D integer numpy array; lengths
    (numpy batches only): row i is batch[i, :lengths[i]]."""
    if isinstance(batch, np.ndarray):
        if batch.ndim != 2 or batch.dtype.kind not in "iu":
            raise TypeError(
                f"{what}: a numpy batch must be a 2-D integer array [B, T], got {batch.ndim}-D {batch.dtype}"
                + (" (ragged sequences: pass a list of lists, or a padded 2-D array with lengths=)"
                   if batch.dtype == object else ""))
        B, T = batch.shape
        if B == 0:
            raise ValueError(f"{what}: empty batch (need at least one sequence)")
        if lengths is None:
            rows = [_int32_row(batch[i], f"{what} sequence {i + 1}") for i in range(B)]
        else:
            lens = np.asarray(lengths)
            if lens.ndim != 1 or lens.dtype.kind not in "iu":
                raise TypeError(f"{what}: lengths must be a 1-D sequence of ints, got {lens.dtype} of shape {lens.shape}")
            if lens.shape[0] != B:
                raise ValueError(f"{what}: {lens.shape[0]} lengths for {B} sequences")
            for i, n in enumerate(lens.tolist()):
                if n < 0 or n > T:
                    raise ValueError(f"{what}: lengths[{i}] = {n} is outside [0, {T}] (the array's width)")
            rows = [_int32_row(batch[i, :n], f"{what} sequence {i + 1}") for i, n in enumerate(lens.tolist())]
    else:
        if lengths is not None:
            raise TypeError(f"{what}: lengths= applies to a 2-D numpy batch, not to {type(batch).__name__}")
        if isinstance(batch, (str, bytes)) or not isinstance(batch, (list, tuple)):
            raise TypeError(f"{what} must be a list of token-id lists or a 2-D integer numpy array, "
                            f"got {type(batch).__name__}")
        if len(batch) == 0:
            raise ValueError(f"{what}: empty batch (need at least one sequence)")
        if all(_is_int(v) for v in batch):
            raise TypeError(f"{what} must be a list of sequences (a batch), got a flat list of ints; "
                            f"wrap one sequence as [[...]]")
        rows = [_int32_row(r, f"{what} sequence {i + 1}") for i, r in enumerate(batch)]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    ids = np.concatenate(rows) if rows else np.zeros(0, np.int32)
    return np.ascontiguousarray(ids, dtype=np.int32), offsets



def _existing_file(what, path):
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} {path!r}: no such file")
    if os.path.isdir(path):
        raise FileNotFoundError(f"{what} {path!r} is a directory, not a file")
    return path
