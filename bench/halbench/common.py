"""Shared helpers of the benchmark harness: paths, progress lines, spec sizes, statistics,
the peer-process protocol and the output check rules.

Peer protocol: the harness writes a task JSON, runs `python -m halbench.peer_<name> TASK
RESULT` in a fresh process (so that one engine's thread pool cannot spin while another
is timed, and a crashing engine cannot take the harness down), and reads RESULT:

    {"system": "onnxruntime", "status": "ok" | "skipped" | "unsupported" | "error",
     "reason": "...", "versions": {...}, "notes": [...],
     "checks":  [{"scenario": "encoder", "batch": 1, "ok": true, "detail": "...", ...}],
     "timings": [{"scenario": "encoder", "batch": 1, "samples_ms": [...], ...}]}

A (scenario, batch) is timed only after its check passed; a failed check is recorded and
that scenario is left untimed.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCH_DIR)
TOOLS_DIR = os.path.join(ROOT, "tools")
REFERENCE_DIR = os.path.join(ROOT, "tests", "reference")  # halformer_torch, the PyTorch reference

# Progress lines count from the harness's start, in the harness and in every peer process.
_T0 = float(os.environ.setdefault("HALBENCH_T0", repr(time.time())))


def log(msg: str) -> None:
    """A progress line on stderr: '[bench   12s] msg'."""
    sys.stderr.write(f"[bench {time.time() - _T0:5.0f}s] {msg}\n")
    sys.stderr.flush()


def median(values: Sequence[float]) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def read_json(path: str) -> Any:
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


def write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------
# spec: only what the harness needs (sizes, tokens, placement), with halformer's defaults.
# The full reading (every default) is halformer_torch.load_spec (tests/reference), used by the peers;
# the harness process itself does not import torch.

def load_spec_light(path: str) -> Dict[str, Any]:
    import yaml

    with open(path, "r", encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    if not isinstance(spec, dict):
        raise SystemExit(f"bench: {path}: a spec must be a YAML mapping")
    arch = spec.get("architecture", "encoder_decoder")
    if arch != "encoder_decoder":
        raise SystemExit(f"bench: {path}: architecture {arch!r}: the benchmark covers encoder_decoder specs")
    s = spec.get("sizes") or {}
    need = ("d_model", "heads", "d_ff", "encoder_layers", "decoder_layers", "src_vocab", "tgt_vocab", "max_len")
    missing = [k for k in need if k not in s]
    if missing:
        raise SystemExit(f"bench: {path}: missing " + ", ".join("sizes." + k for k in missing))
    tok = spec.get("tokens") or {}
    layer = spec.get("layer") or {}
    return {
        "name": spec.get("name", os.path.splitext(os.path.basename(path))[0]),
        "sizes": {k: int(s[k]) for k in need},
        "pad": int(tok.get("pad", 0)),
        "bos": int(tok.get("bos", 1)),
        "eos": int(tok.get("eos", 2)),
        "final_norm": bool(layer.get("final_norm", False)),
        "schedule": spec.get("schedule") or {},
    }


# --------------------------------------------------------------------------------------
# work counts: FLOPs and weight bytes (fp32). Only matmul-shaped work is counted
# (projections, attention scores and values); embeddings, LayerNorm, softmax are O(d)
# per token and left out, as is customary.

def encoder_flops(sz: Dict[str, int], batch: int, src_len: int) -> float:
    d, f, L = sz["d_model"], sz["d_ff"], sz["encoder_layers"]
    tokens = batch * src_len
    per_layer = 2.0 * tokens * (4 * d * d + 2 * d * f) + 4.0 * batch * src_len * src_len * d
    return L * per_layer


def decode_step_flops(sz: Dict[str, int], batch: int, src_len: int, new_tokens: int) -> float:
    """Mean FLOPs of one decoder step (one new token per sequence) over a decode of
    new_tokens steps: self-attention sees 1..new_tokens cached positions."""
    d, f, L, V = sz["d_model"], sz["d_ff"], sz["decoder_layers"], sz["tgt_vocab"]
    mean_ctx = (new_tokens + 1) / 2.0
    per_layer = (2.0 * batch * (3 * d * d + d * d + d * d + d * d + 2 * d * f)  # qkv, out, cross q, cross out, ffn
                 + 4.0 * batch * mean_ctx * d + 4.0 * batch * src_len * d)   # self + cross attention
    return L * per_layer + 2.0 * batch * d * V


def decode_weight_bytes(sz: Dict[str, int], final_norm: bool = False, precision: str = "fp32") -> int:
    """Weight bytes one decoder step must read: every decoder weight except the
    cross-attention K/V projections (applied once per source, before decoding), plus the
    output projection. KV-cache and memory reads are activations, not counted here.
    int8: matrices at one byte per weight, plus an fp32 scale per output channel; bf16:
    matrices at two bytes per weight; biases and norms stay fp32."""
    d, f, L, V = sz["d_model"], sz["d_ff"], sz["decoder_layers"], sz["tgt_vocab"]
    matrices = L * (3 * d * d + d * d + d * d + d * d + 2 * d * f) + V * d  # qkv, out, cross q/out, ff; output
    channels = L * (3 * d + d + d + d + f + d) + V                         # biases (one per output channel)
    norms = L * 3 * 2 * d + (2 * d if final_norm else 0)                   # three LayerNorms per layer
    if precision == "int8":
        return matrices + 4 * (2 * channels + norms)
    if precision == "bf16":
        return 2 * matrices + 4 * (channels + norms)
    return 4 * (matrices + channels + norms)


def decode_cache_bytes(sz: Dict[str, int], batch: int, src_len: int, new_tokens: int) -> int:
    """Mean activation bytes a step reads from the caches (self K/V so far + memory K/V)."""
    d, L = sz["d_model"], sz["decoder_layers"]
    mean_ctx = (new_tokens + 1) / 2.0
    return int(4 * L * batch * 2 * d * (mean_ctx + src_len))


# --------------------------------------------------------------------------------------
# output checks, shared by every peer

ENCODER_REL_TOL = 1e-3   # max |peer - halformer| <= ENCODER_REL_TOL * max |halformer|
MARGIN_TOL = 1e-3        # a greedy divergence is accepted only at a near-tie (top1 - top2 < this)


# Reduced-precision runs (bench/run --precision int8) are checked against halformer's fp32
# outputs with this bound instead; their greedy tokens are reported, not required equal.
REDUCED_ENCODER_REL_TOL = 0.05


def reduced_precision_check(result: Dict[str, Any]) -> Dict[str, Any]:
    """A token check of a reduced-precision system: recorded, never failed (see above)."""
    return dict(result, ok=True, detail="reduced precision, agreement with fp32 reported only: " + result["detail"])


def check_encoder(peer, ref, rel_tol: float = ENCODER_REL_TOL) -> Dict[str, Any]:
    """peer, ref: numpy arrays [B, S, d]."""
    import numpy as np

    peer = np.asarray(peer, dtype=np.float32)
    ref = np.asarray(ref, dtype=np.float32)
    if peer.shape != ref.shape:
        return {"ok": False, "detail": f"encoder output shape {list(peer.shape)} != halformer's {list(ref.shape)}"}
    if not np.all(np.isfinite(peer)):
        return {"ok": False, "detail": "encoder output has NaN/inf"}
    err = float(np.max(np.abs(peer - ref)))
    scale = float(np.max(np.abs(ref)))
    ok = err <= rel_tol * scale
    return {"ok": bool(ok), "max_abs_err": err, "scale": scale,
            "detail": f"encoder max |err| {err:.2e} (scale {scale:.2f}, tol {rel_tol:g} x scale)"}


def truncate_at_eos(tokens: Sequence[int], eos: int) -> List[int]:
    out = []
    for t in tokens:
        t = int(t)
        if t < 0:
            break
        out.append(t)
        if t == eos:
            break
    return out


def check_tokens(peer_rows: Sequence[Sequence[int]], ref_rows: Sequence[Sequence[int]], eos: int,
                 margins: Optional[Sequence[Sequence[float]]] = None,
                 margin_paths: Optional[Sequence[Sequence[int]]] = None) -> Dict[str, Any]:
    """Greedy tokens of a peer vs halformer's, row by row, both truncated after eos.

    A row passes if identical, or if it first differs at step s where the top-1/top-2 gap
    of the head output is < MARGIN_TOL (a near-tie that fp32 summation order may flip;
    everything after s legitimately differs). The gap comes from `margins[row][s]`, valid
    only if `margin_paths[row]` (the tokens that produced those margins) equals halformer's
    tokens before s; margin_paths=None means the margins come from the peer itself.
    """
    rows, exact, ties, bad = len(ref_rows), 0, [], []
    if len(peer_rows) != rows:
        return {"ok": False, "detail": f"{len(peer_rows)} sequences, halformer has {rows}"}
    for r in range(rows):
        want = truncate_at_eos(ref_rows[r], eos)
        have = truncate_at_eos(peer_rows[r], eos)
        if want == have:
            exact += 1
            continue
        s = next((i for i in range(min(len(want), len(have))) if want[i] != have[i]), min(len(want), len(have)))
        m = None
        if margins is not None and r < len(margins) and s < len(margins[r]):
            path = margin_paths[r] if margin_paths is not None else have
            if [int(t) for t in path[:s]] == want[:s]:
                m = float(margins[r][s])
        if m is not None and m < MARGIN_TOL:
            ties.append({"row": r, "step": s, "margin": m})
        else:
            bad.append({"row": r, "step": s, "margin": m, "halformer": want[s:s + 4], "peer": have[s:s + 4]})
    ok = not bad
    detail = f"greedy tokens: {exact}/{rows} rows identical"
    if ties:
        detail += ", " + ", ".join(f"row {t['row']} diverges at step {t['step']} on a near-tie "
                                   f"(margin {t['margin']:.1e})" for t in ties)
    if bad:
        b = bad[0]
        detail += (f", {len(bad)} row(s) differ: row {b['row']} at step {b['step']} "
                   f"halformer {b['halformer']} vs {b['peer']}"
                   + (f" (margin {b['margin']:.2e})" if b["margin"] is not None else " (no margin to judge)"))
    return {"ok": ok, "rows": rows, "identical_rows": exact, "near_ties": ties, "mismatches": bad, "detail": detail}


# --------------------------------------------------------------------------------------
# peer processes

class PeerResult:
    """Collects what a peer process reports; written as the RESULT JSON."""

    def __init__(self, system: str):
        self.data: Dict[str, Any] = {"system": system, "status": "ok", "reason": "", "versions": {},
                                     "notes": [], "checks": [], "timings": []}

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        log(f"{self.data['system']}: {text}")

    def check(self, scenario: str, batch: int, result: Dict[str, Any]) -> bool:
        entry = {"scenario": scenario, "batch": batch}
        entry.update(result)
        self.data["checks"].append(entry)
        log(f"{self.data['system']}: check {scenario} b{batch}: {'ok' if result['ok'] else 'FAILED'}: "
            f"{result['detail']}")
        return bool(result["ok"])

    def timing(self, scenario: str, batch: int, samples_ms: List[float], **extra: Any) -> None:
        entry = {"scenario": scenario, "batch": batch, "samples_ms": [float(x) for x in samples_ms]}
        entry.update(extra)
        self.data["timings"].append(entry)
        what = f"{extra['system']} {extra['shape']}" if "shape" in extra else f"{scenario} b{batch}"
        log(f"{self.data['system']}: {what}: median {median(samples_ms):.4g} ms ({len(samples_ms)} samples)")

    def finish(self, status: str, reason: str = "") -> None:
        self.data["status"] = status
        self.data["reason"] = reason


def quiet_warnings() -> None:
    """Drop the peers' known, harmless warnings from the progress output."""
    import warnings

    for text in ("You are using the legacy TorchScript-based ONNX export", "The PyTorch API of nested tensors",
                 "TypedStorage is deprecated", "enable_nested_tensor is True"):
        warnings.filterwarnings("ignore", message=".*" + text)


def peer_main(system: str, body) -> None:
    """Entry point of a peer module: python -m halbench.peer_x TASK RESULT."""
    import traceback

    quiet_warnings()
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: python -m halbench.peer_{system} TASK.json RESULT.json")
    task = read_json(sys.argv[1])
    res = PeerResult(task.get("system", system))  # e.g. "ctranslate2-int8" for a reduced-precision run
    try:
        body(task, res)
    except Unavailable as e:
        res.finish("skipped", str(e))
    except Unsupported as e:
        res.finish("unsupported", str(e))
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        traceback.print_exc()
        res.finish("error", f"{type(e).__name__}: {e}")
    write_json(sys.argv[2], res.data)


class Unavailable(Exception):
    """The peer's package is not installed (quick mode without the bench venv)."""


class Unsupported(Exception):
    """The peer cannot express this spec (reported, not an error of the harness)."""


def timed_runs(fn, warmup: int, repeat: int) -> List[float]:
    """Calls fn() warmup times, then returns `repeat` wall times in ms."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def record_step_times(res, batch: int, t_n: List[float], t_1: List[float], n: int) -> None:
    """Decode per step from whole generate() calls of N and of 1 tokens: (T(N) - median
    T(1)) / (N - 1) per sample. When noise swamps the difference (a tiny model on a busy
    machine: some difference <= 0), T(N) / N instead -- an upper bound, said in a note."""
    one = median(t_1)
    steps = [(t - one) / (n - 1) for t in t_n]
    method = "(T(N) - median T(1)) / (N - 1)"
    if min(steps) <= 0:
        steps = [t / n for t in t_n]
        method = "T(N) / N (upper bound: T(N) - T(1) was within the timing noise)"
        res.note(f"decode b{batch}: T({n}) - T(1) within the timing noise; per step reported as T({n}) / {n}")
    res.timing("decode", batch, steps, steps=n, method=method, t1_ms=t_1, tn_ms=t_n)


def read_sources(path: str) -> List[List[int]]:
    with open(path, "r", encoding="utf-8") as f:
        return [[int(t) for t in line.split()] for line in f if line.strip()]


def load_reference(path: str):
    """halformer's dump for one batch: encoder_output [B, S, d], greedy [B, N] (-1 padded)."""
    from safetensors.numpy import load_file

    t = load_file(path)
    return t["encoder_output"], t["greedy"]


def fmt_num(x: Optional[float], digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "-"
    return f"{x:.{digits}f}"


def conversion_stamp(out_dir, weights, spec_path, **versions):
    """(stamp, path): what a converted peer model was made from -- the weights file
    (path, size, mtime), the spec text and the converter versions. A conversion is
    reused only when its stored stamp equals the current one (see is_current)."""
    st = os.stat(weights)
    stamp = {"weights": os.path.abspath(weights), "size": st.st_size, "mtime": st.st_mtime,
             "spec": open(spec_path).read(), **versions}
    return stamp, os.path.join(out_dir, "stamp.json")


def is_current(stamp, stamp_path):
    try:
        with open(stamp_path) as f:
            return json.load(f) == stamp
    except (OSError, ValueError):
        return False


def model_descriptor_args(model_dir: str, name: str) -> List[str]:
    """Compiler flags that give bench/cpp/model_bench.cpp a built model's descriptor
    (DIR/<name>.h declares halformer_model_<name with non-alphanumerics as '_'>())."""
    import re
    cname = re.sub(r"[^A-Za-z0-9]", "_", name)
    if not cname or cname[0].isdigit():
        cname = "m_" + cname
    return ["-include", os.path.join(model_dir, f"{name}.h"), f"-DHALFORMER_MODEL=halformer_model_{cname}"]
