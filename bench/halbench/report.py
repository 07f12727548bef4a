"""Results: one row per (system, scenario) with derived columns, the printed table, the
results JSON and the PNG chart.

Columns (docs/bench.md explains each):
  median ms   encoder: one forward; decode: mean step of a fixed-length greedy decode
              (one new token per sequence), median over runs; matmul: one call
  tokens/s    encoder: source tokens encoded per second (B * S / time);
              decode: tokens generated per second (B / step time)
  ratio       this system's median / halformer's for the same scenario (> 1: halformer faster)
  GFLOP/s     counted matmul FLOPs / time (common.encoder_flops, decode_step_flops, 2MKN)
  % peak      GFLOP/s / the measured peak of the system's precision at the same thread count:
              fp32 FMA loop; int8 systems: the int8 kernels' instruction loop (vpdpbusd /
              vpdpwssd / vpmaddwd, bench/cpp/peak.cpp), GOP/s; bf16: vdpbf16ps; on AMX
              CPUs the int8 / bf16 encoder rows: the tile multiply's (tdpbusd / tdpbf16ps)
  % BW bound  decode and M <= 8 matmuls: (weight bytes read / measured read bandwidth) / time
"""
from __future__ import annotations

import datetime
from typing import Any, Dict, List, Optional

from .common import (decode_cache_bytes, decode_step_flops, decode_weight_bytes, encoder_flops, fmt_num, median)

SYSTEM_ORDER = ["halformer", "halformer-int8", "halformer-bf16", "halformer-python", "pytorch", "pytorch-bf16", "onnxruntime", "onnxruntime-int8",
                "ctranslate2", "ctranslate2-int8", "ctranslate2-bf16", "torch", "numpy"]


def _row(system, kind, batch, scenario, samples, flops, peak, bw_bytes=None, tokens=None, compute_peak=None,
         **extra):
    ms = median(samples) if samples else None
    row = {"system": system, "kind": kind, "batch": batch, "scenario": scenario, "status": "ok",
           "median_ms": ms, "samples_ms": samples, "tokens_per_s": None, "ratio": None,
           "gflops": None, "pct_peak": None, "pct_bw_bound": None}
    if ms:
        row["gflops"] = flops / (ms * 1e-3) * 1e-9
        row["pct_peak"] = 100.0 * row["gflops"] / (compute_peak or peak["gflops"])
        if tokens:
            row["tokens_per_s"] = tokens / (ms * 1e-3)
        if bw_bytes:
            bound_ms = bw_bytes / (peak["gbs"] * 1e9) * 1e3
            row["bw_bound_ms"] = bound_ms
            row["pct_bw_bound"] = 100.0 * bound_ms / ms
    row.update(extra)
    return row


def _status_row(system, kind, batch, scenario, status, note):
    return {"system": system, "kind": kind, "batch": batch, "scenario": scenario, "status": status,
            "median_ms": None, "samples_ms": [], "tokens_per_s": None, "ratio": None, "gflops": None,
            "pct_peak": None, "pct_bw_bound": None, "note": note}


def assemble(*, spec, spec_path, weights, weights_bytes, settings, machine, git, peak, halformer, peers, matmul,
             cfg, python_env, elapsed_s, halformer_variants=None) -> Dict[str, Any]:
    sz = spec["sizes"]
    S, N = settings["src_len"], settings["new_tokens"]
    wbytes = decode_weight_bytes(sz, spec["final_norm"])
    # Reduced-precision systems ("halformer-int8", "ctranslate2-int8"): their own bandwidth
    # bound (bytes per weight) and compute peak (the int8 instruction loop, where measured).
    wbytes_reduced = {p: decode_weight_bytes(sz, spec["final_norm"], p) for p in ("int8", "bf16")}
    rows: List[Dict[str, Any]] = []
    scen_enc = {b: f"encoder b{b} s{S}" for b in settings["batches"]}
    scen_dec = {b: f"decode b{b} ({N} tok)" for b in settings["batches"]}
    notes: List[str] = []

    def model_row(system, scenario, b, samples, **extra):
        precision = system.rsplit("-", 1)[-1] if system.endswith(("-int8", "-bf16")) else "fp32"
        compute_peak = {"int8": peak.get("int8_peak_gops"), "bf16": peak.get("bf16_peak_gflops")}.get(precision)
        if scenario == "encoder":
            compute_peak = {"int8": peak.get("amx_peak_int8_gops"),
                            "bf16": peak.get("amx_peak_bf16_gflops")}.get(precision) or compute_peak
            return _row(system, "encoder", b, scen_enc[b], samples, encoder_flops(sz, b, S), peak, tokens=b * S,
                        compute_peak=compute_peak, **extra)
        return _row(system, "decode", b, scen_dec[b], samples, decode_step_flops(sz, b, S, N), peak,
                    bw_bytes=wbytes_reduced.get(precision, wbytes), tokens=b, compute_peak=compute_peak, **extra)

    # halformer, then its reduced-precision builds
    rss = 0
    variant_rss = {}
    for hal in [halformer] + list((halformer_variants or {}).values()):
        system = hal["system"]
        for b in settings["batches"]:
            r = hal["runs"][str(b)]
            rows.append(model_row(system, "encoder", b, r["encoder_ms"]))
            means = [sum(d["step_ms"]) / len(d["step_ms"]) for d in r["decode"]]
            steps = min(len(d["step_ms"]) for d in r["decode"])
            extra = {"steps": steps}
            if steps < N:
                extra["note"] = f"stopped after {steps} steps (every sequence emitted eos)"
                notes.append(f"{system} decode b{b}: {extra['note']}; per-step means are over {steps} steps")
            rows.append(model_row(system, "decode", b, means, **extra))
            peak_rss = max(r.get("max_rss_bytes", 0), r.get("max_rss_bytes_decode", 0))
            if hal is halformer:
                rss = max(rss, peak_rss)
            else:
                variant_rss[system] = max(variant_rss.get(system, 0), peak_rss)

    # model peers
    peer_status = {}
    for p in peers:
        name = p["system"]
        peer_status[name] = {k: p.get(k) for k in ("status", "reason", "versions", "notes", "checks")}
        if p["status"] != "ok":
            rows.append(_status_row(name, "model", None, "(all)", p["status"], p.get("reason", "")))
            continue
        timed = {(t["scenario"], t["batch"]): t for t in p["timings"]}
        for c in p["checks"]:
            key = (c["scenario"], c["batch"])
            scen = (scen_enc if c["scenario"] == "encoder" else scen_dec)[c["batch"]]
            if not c["ok"]:
                rows.append(_status_row(name, c["scenario"], c["batch"], scen, "failed check", c["detail"]))
            elif key in timed:
                t = timed[key]
                extra = {"check": c["detail"]}
                if "method" in t:
                    extra["method"] = t["method"]
                rows.append(model_row(name, c["scenario"], c["batch"], t["samples_ms"], **extra))

    # matmul
    if matmul:
        for r in matmul["halformer"]:
            if "median_ms" not in r:
                continue
            rows.append(_matmul_row("halformer", r["shape"], r["samples_ms"], peak,
                                    max_rel_err=r.get("max_rel_err"), copies=r.get("copies")))
        for s in matmul.get("missing", []):
            rows.append(_status_row("halformer", "matmul", None, f"matmul {s}", "no kernel",
                                    "K x N pair not compiled in bench/CMakeLists.txt"))
        mp = matmul.get("peers") or {}
        peer_status["matmul-peers"] = {k: mp.get(k) for k in ("status", "reason", "versions", "notes")}
        for t in mp.get("timings", []):
            rows.append(_matmul_row(t["system"], t["shape"], t["samples_ms"], peak, copies=t.get("copies")))

    # ratios vs halformer, per scenario
    base = {r["scenario"]: r["median_ms"] for r in rows if r["system"] == "halformer" and r["median_ms"]}
    for r in rows:
        if r["median_ms"] and r["scenario"] in base:
            r["ratio"] = r["median_ms"] / base[r["scenario"]]

    for name, p in peer_status.items():
        if p.get("status") not in (None, "ok"):
            notes.append(f"{name}: {p['status']}: {p.get('reason')}")
    notes.append(f"halformer peak resident memory {rss / 2**20:.0f} MiB = {rss / weights_bytes:.2f} x the weights "
                 f"file ({weights_bytes / 2**20:.0f} MiB)")
    for system, v in variant_rss.items():
        notes.append(f"{system} peak resident memory {v / 2**20:.0f} MiB = {v / weights_bytes:.2f} x the fp32 "
                     f"weights file")
    return {
        "schema": "halformer-bench/1",
        "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "mode": "quick" if settings["quick"] else "full",
        "elapsed_s": round(elapsed_s, 1),
        "git": git,
        "machine": machine,
        "build": {"halide": cfg.get("halide_version"), "cxx": cfg.get("cxx_id"), "build_type": cfg.get("build_type")},
        "python_env": python_env,
        "spec": {"path": spec_path, "name": spec["name"], "sizes": sz},
        "weights": {"path": weights, "bytes": weights_bytes},
        "settings": settings,
        "peak": peak,
        "work": {"decode_weight_bytes_per_step": wbytes,
                 "decode_cache_bytes_per_step": {str(b): decode_cache_bytes(sz, b, S, N) for b in settings["batches"]},
                 "encoder_flops": {str(b): encoder_flops(sz, b, S) for b in settings["batches"]},
                 "decode_step_flops": {str(b): decode_step_flops(sz, b, S, N) for b in settings["batches"]}},
        "halformer": {"peak_rss_bytes": rss, "rss_over_weights": rss / weights_bytes,
                      "profiles": halformer.get("profiles", {}),
                      "raw": halformer["runs"]},
        "halformer_variants": {s: {"peak_rss_bytes": v, "rss_over_weights": v / weights_bytes}
                               for s, v in variant_rss.items()},
        "peers": peer_status,
        "rows": sorted(rows, key=_order),
        "notes": notes,
    }


def _matmul_row(system, shape, samples, peak, **extra):
    m, k, n = (int(v) for v in shape.split("x"))
    bw = 4.0 * k * n if m <= 8 else None
    return _row(system, "matmul", m, f"matmul {shape}", samples, 2.0 * m * k * n, peak, bw_bytes=bw, **extra)


def _order(r):
    kind = {"encoder": 0, "decode": 1, "model": 2, "matmul": 3}.get(r["kind"], 4)
    sysi = SYSTEM_ORDER.index(r["system"]) if r["system"] in SYSTEM_ORDER else 99
    if r["kind"] == "matmul":
        m, k, n = (int(v) for v in r["scenario"].split()[1].split("x"))
        return (kind, -m if m > 8 else 1e9 - m, k, n, sysi)
    return (kind, r["batch"] or 0, sysi)


def table(res: Dict[str, Any]) -> str:
    m, pk, st = res["machine"], res["peak"], res["settings"]
    lines = [
        f"halformer benchmark ({res['mode']}): {res['spec']['name']}, {st['threads']} threads, "
        f"commit {(res['git'].get('commit') or '?')[:12]}, {res['created']}",
        f"machine: {m.get('cpu')}, {m.get('cores_online')} cores; measured peak {pk['gflops']:.0f} GFLOP/s fp32 "
        f"({pk['isa']} FMA)"
        + (f", {pk['int8_peak_gops']:.0f} GOP/s int8 ({pk['int8_instruction']})" if pk.get("int8_peak_gops") else "")
        + (f", {pk['bf16_peak_gflops']:.0f} GFLOP/s bf16 ({pk['bf16_instruction']})" if pk.get("bf16_peak_gflops") else "")
        + (f", AMX {pk['amx_peak_int8_gops']:.0f} GOP/s int8 (tdpbusd) / {pk['amx_peak_bf16_gflops']:.0f} GFLOP/s bf16 "
           "(tdpbf16ps)" if pk.get("amx_peak_int8_gops") else "")
        + f", {pk['gbs']:.1f} GB/s read; load average {m.get('loadavg_start', ['?'])[0]:.2f} -> "
        f"{m.get('loadavg_end', ['?'])[0]:.2f}",
        f"decode bound: {res['work']['decode_weight_bytes_per_step'] / 1e6:.3g} MB of weights per step / "
        f"{pk['gbs']:.1f} GB/s = {res['work']['decode_weight_bytes_per_step'] / (pk['gbs'] * 1e9) * 1e3:.2f} ms",
        "",
    ]
    hdr = ["system", "scenario", "median ms", "tokens/s", "ratio", "GFLOP/s", "% peak", "% BW bound", "note"]
    body = []
    prev_kind = None
    for r in res["rows"]:
        if prev_kind is not None and (r["kind"], r["scenario"]) != prev_kind and r["system"] == "halformer":
            body.append(None)
        prev_kind = (r["kind"], r["scenario"])
        if r["status"] != "ok":
            body.append([r["system"], r["scenario"], "-", "-", "-", "-", "-", "-",
                         f"{r['status'].upper()}: {r.get('note', '')}"])
            continue
        ms = r["median_ms"]
        body.append([
            r["system"], r["scenario"],
            fmt_num(ms, 3 if ms < 10 else 2),
            fmt_num(r["tokens_per_s"], 0) if r["tokens_per_s"] else "-",
            fmt_num(r["ratio"], 2),
            fmt_num(r["gflops"], 1),
            fmt_num(r["pct_peak"], 1),
            fmt_num(r["pct_bw_bound"], 1) if r["pct_bw_bound"] else "-",
            r.get("note", "") or "",
        ])
    widths = [max(len(hdr[i]), *(len(str(b[i])) for b in body if b)) for i in range(len(hdr) - 1)]
    fmt_row = lambda cells: "  ".join(  # noqa: E731
        (str(c).ljust(widths[i]) if i < 2 else str(c).rjust(widths[i])) for i, c in enumerate(cells[:-1])
    ) + (("  " + cells[-1]) if cells[-1] else "")
    lines.append(fmt_row(hdr))
    lines.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
    for b in body:
        lines.append("" if b is None else fmt_row(b))
    lines.append("")
    lines.append("ratio = system time / halformer time for the same scenario (> 1: halformer is faster); "
                 "decode ms = mean time per step (one token per sequence)")
    for n in res["notes"]:
        lines.append("note: " + n)
    return "\n".join(lines)


def chart(res: Dict[str, Any], path: str) -> Optional[str]:
    """Grouped bars: encoder ms, decode ms/step, matmul GFLOP/s (with the measured peak)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in res["rows"] if r["status"] == "ok" and r["median_ms"]]
    panels = [("encoder", "encoder forward: ms, log scale (lower is better)", "median_ms"),
              ("decode", "greedy decode: ms per step, log scale (lower is better)", "median_ms"),
              ("matmul", "matmul in isolation: GFLOP/s (higher is better)", "gflops")]
    panels = [p for p in panels if any(r["kind"] == p[0] for r in rows)]
    if not panels:
        return None
    colors = {"halformer": "#d62728", "halformer-python": "#ff9896", "pytorch": "#1f77b4", "torch": "#1f77b4", "onnxruntime": "#7f7f7f",
              "ctranslate2": "#2ca02c", "numpy": "#9467bd"}
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.6 * len(panels)), squeeze=False)
    for ax, (kind, title, key) in zip(axes[:, 0], panels):
        sel = [r for r in rows if r["kind"] == kind]
        scen = list(dict.fromkeys(r["scenario"] for r in sel))
        systems = [s for s in SYSTEM_ORDER if any(r["system"] == s for r in sel)]
        width = 0.8 / max(1, len(systems))
        for i, s in enumerate(systems):
            xs, ys = [], []
            for j, sc in enumerate(scen):
                v = next((r[key] for r in sel if r["system"] == s and r["scenario"] == sc), None)
                if v is not None:
                    xs.append(j + (i - (len(systems) - 1) / 2) * width)
                    ys.append(v)
            bars = ax.bar(xs, ys, width, label=s, color=colors.get(s))
            for x, y in zip(xs, ys):
                ax.text(x, y, f"{y:.3g}", ha="center", va="bottom", fontsize=7)
            del bars
        if kind != "matmul":
            ax.set_yscale("log")
        if kind == "matmul":
            ax.axhline(res["peak"]["gflops"], color="k", ls="--", lw=0.8, label="measured FP32 peak")
        ax.set_xticks(range(len(scen)))
        ax.set_xticklabels([s.replace("matmul ", "") for s in scen], fontsize=8, rotation=15 if kind == "matmul" else 0)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    commit = (res["git"].get("commit") or "?")[:10]
    fig.suptitle(f"halformer bench: {res['spec']['name']}, {res['settings']['threads']} threads, "
                 f"{res['machine'].get('cpu', '')}, commit {commit}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
