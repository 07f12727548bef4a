"""Checks that a results.json is complete and sane (the bench_quick smoke test's assertions).

    python -m halbench.validate RESULTS.json     -> exit 0, or 1 with one line per problem

It checks the harness, not the speed: every field present, every number positive and
finite, halformer timed for every scenario, every peer ok / skipped (never an error or a
failed check), and the PyTorch peer (always installed: tools/bootstrap.sh's Debian torch)
checked and timed.
"""
from __future__ import annotations

import json
import math
import sys
from typing import List


def _pos(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def validate(path: str) -> List[str]:
    with open(path) as f:
        r = json.load(f)
    bad: List[str] = []
    for key in ("schema", "created", "git", "machine", "spec", "settings", "peak", "rows", "peers", "halformer"):
        if key not in r:
            bad.append(f"missing field {key!r}")
    if bad:
        return bad
    if r["schema"] != "halformer-bench/1":
        bad.append(f"schema {r['schema']!r}")
    pk = r["peak"]
    for key in ("gflops", "gbs"):
        if not _pos(pk.get(key)):
            bad.append(f"peak.{key} = {pk.get(key)!r}")
    if _pos(pk.get("gflops")) and not 1 < pk["gflops"] < 1e5:
        bad.append(f"peak GFLOP/s {pk['gflops']} is not plausible")
    st = r["settings"]
    rows = r["rows"]
    for b in st["batches"]:
        for kind in ("encoder", "decode"):
            hs = [x for x in rows if x["system"] == "halformer" and x["kind"] == kind and x["batch"] == b]
            if len(hs) != 1:
                bad.append(f"halformer {kind} b{b}: {len(hs)} rows")
                continue
            h = hs[0]
            for key in ("median_ms", "tokens_per_s", "gflops", "pct_peak"):
                if not _pos(h.get(key)):
                    bad.append(f"halformer {kind} b{b}: {key} = {h.get(key)!r}")
            if h.get("ratio") != 1.0:
                bad.append(f"halformer {kind} b{b}: ratio vs itself = {h.get('ratio')!r}")
            if kind == "decode" and not _pos(h.get("pct_bw_bound")):
                bad.append(f"halformer decode b{b}: pct_bw_bound = {h.get('pct_bw_bound')!r}")
    for name, p in r["peers"].items():
        if p.get("status") not in ("ok", "skipped"):
            bad.append(f"peer {name}: status {p.get('status')!r}: {p.get('reason')}")
    for x in rows:
        if x["status"] == "failed check":
            bad.append(f"{x['system']} {x['scenario']}: failed check: {x.get('note')}")
        if x["status"] == "ok" and not _pos(x.get("median_ms")):
            bad.append(f"{x['system']} {x['scenario']}: median_ms = {x.get('median_ms')!r}")
    pt = r["peers"].get("pytorch")
    if pt is None or pt.get("status") != "ok":
        bad.append("pytorch peer did not run (Debian torch should be installed by tools/bootstrap.sh)")
    else:
        for b in st["batches"]:
            for kind in ("encoder", "decode"):
                if not any(x["system"] == "pytorch" and x["kind"] == kind and x["batch"] == b and x["status"] == "ok"
                           for x in rows):
                    bad.append(f"pytorch {kind} b{b}: not checked and timed")
    if not any(x["kind"] == "matmul" and x["system"] == "halformer" and x["status"] == "ok" for x in rows):
        bad.append("no halformer matmul row")
    # (git.commit may legitimately be null: a tree without .git, e.g. an exported tarball)
    return bad


if __name__ == "__main__":
    problems = validate(sys.argv[1])
    for p in problems:
        print("FAIL:", p)
    sys.exit(1 if problems else 0)
