#!/usr/bin/env python3
"""Assemble every CUDA kernel's PTX with ptxas: no errors, no spills; report resources.

    ptxas_check.py [options] LIB...      .a / .o files made by Halide for a CUDA target
                                         (or raw .ptx files)
    ptxas_check.py [options] --model DIR a model built by `halformer build SPEC -o DIR`
                                         (DIR, DIR/.halformer/build, or a plan.cmake)

For every PTX module embedded in the given objects (Halide keeps the PTX text of a
pipeline's kernels NUL-terminated inside the host object) this writes the module to a
work directory and runs `ptxas -v --gpu-name sm_XX` for each requested SM (default
sm_80 and sm_90). Per kernel entry it reports registers per thread, spill stores and
loads, stack frame, static shared memory and barriers (all from ptxas), and the launch
configuration: Halide's PTX carries no .maxntid/.reqntid, and Halide gives every CUDA
kernel its shared memory as *dynamic* shared memory sized by the host code at launch,
so both the block size and the shared memory come from the pipeline's lowered statement
(`-e stmt`, `<lib>.stmt`): the `halide_cuda_run(state, "entry", blocks x3, threads x3,
shared_bytes, ...)` call, evaluated with every dimension the kernel leaves dynamic
(rows, sequence length, keys, batch) set to --extent; a kernel launched only at other
sizes (a `specialize`d path) is evaluated at the nearest power of two below or above
--extent that launches it. From these it computes the theoretical occupancy per SM
with the rules of CUDA's cuda_occupancy.h.

Fails (exit 1), naming the kernel, on: a ptxas error, any spill (> 0 bytes of spill
stores or loads), an object without PTX. With --strict also on: a missing statement, a
statement whose PTX is not the object's (stale), a launch it cannot evaluate, a kernel
entry it never launches (otherwise warnings: the launch only feeds the report). A block
that would need more than 48 KB of shared memory at --extent (Halide's CUDA runtime
does not opt in to more) is a warning, with the largest extent that fits.
Exit 77 when no ptxas is found (PATH, $CUDA_HOME/bin, $CUDA_PATH/bin,
/usr/local/cuda/bin) or it does not run, so that callers (ctest SKIP_RETURN_CODE) can
skip; --skip-ok makes that exit 0 (the build's check: a notice, not a failure).

Options: --sm 80,90 (repeatable)  --extent N  --json FILE  --work DIR  --ptxas PATH
         --stmt-dir DIR  --no-launch  --strict  --skip-ok  --quiet.  Python 3 standard
         library only.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

from ptxas.launch import Unknown, binop, collect_launches, launches_from_stmt, smem_limit_extent  # noqa: F401
from ptxas.occupancy import MAX_THREADS_BLOCK, SMEM_PER_BLOCK_DEFAULT, occupancy
from ptxas.ptx import ENTRY_RE, TARGET_RE, extract_ptx, find_ptxas, kernel_name, ptxas_info, run_ptxas

# tools/ptxas/ holds the pieces (occupancy, PTX and ptxas, launches from the statement);
# this file is the command line and the report. binop, extract_ptx and the rest stay
# importable from here (tests/tools/ptxas/ptxas_check_test.py, tests/layers/check_ptx_loads.py).
SKIP = 77

# ---------------------------------------------------------------------------------------
# Models built by `halformer build`

def read_plan(path):
    with open(path) as f:
        text = f.read()
    sets = dict(re.findall(r"^set\((\w+) ?(.*)\)$", text, re.M))
    kernels = sets.get("HALFORMER_PLAN_KERNELS", "").split()
    if "cuda" not in sets.get("HALFORMER_PLAN_VARIANTS", "").split():
        raise SystemExit("ptxas_check: %s: the spec has no `cuda` in targets" % path)
    sm, max_len = sets.get("HALFORMER_PLAN_CUDA_SM"), int(sets.get("HALFORMER_PLAN_MAX_LEN") or 0)
    return kernels, (int(sm) if sm else None), (max_len or None)


def find_plans(model):
    if model.endswith(".cmake"):
        return [model]
    for d in (model, os.path.join(model, ".halformer", "build")):
        if os.path.isdir(d):
            plans = sorted(os.path.join(d, p, "plan.cmake") for p in os.listdir(d)
                           if p.endswith(".plan") and os.path.isfile(os.path.join(d, p, "plan.cmake")))
            if plans:
                return plans
    raise SystemExit("ptxas_check: no plan (*.plan/plan.cmake) under %s or %s/.halformer/build" % (model, model))


# ---------------------------------------------------------------------------------------

def fmt_occ(o):
    if o is None:
        return "-"
    s = "%3.0f%%" % (100 * o["occupancy"])
    if o["occupancy"] < 1:
        s += " (%s)" % ",".join({"registers": "regs", "shared memory": "smem", "warps": "warps",
                                 "blocks": "blocks", "barriers": "bars"}[x] for x in o["limiters"])
    return s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("libs", nargs="*", help=".a / .o / .ptx files")
    ap.add_argument("--model", help="a model built by `halformer build` (DIR, its .halformer/build or a plan.cmake)")
    ap.add_argument("--sm", action="append", help="SM(s) to assemble for, e.g. 80 or 80,90 (default 80,90)")
    ap.add_argument("--extent", type=int,
                    help="value of every dimension a kernel leaves dynamic, for its launch "
                         "(default: the model's max_len with --model, else 512)")
    ap.add_argument("--json", help="write the results here (on failure: NAME.failed.json instead)")
    ap.add_argument("--work", help="keep the PTX and cubins here (default: a temporary directory)")
    ap.add_argument("--ptxas", help="ptxas to use (default: PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin)")
    ap.add_argument("--stmt-dir", help="where the lowered statements are (default: next to each library): "
                                       "libNAME.a / NAME.o -> NAME.stmt")
    ap.add_argument("--no-launch", action="store_true",
                    help="no statements: registers and spills only (no block size, shared memory, occupancy)")
    ap.add_argument("--strict", action="store_true",
                    help="a launch that cannot be read from the statements (none, stale, not evaluable, "
                         "an entry never launched) fails the check instead of a warning")
    ap.add_argument("--skip-ok", action="store_true",
                    help="exit 0, not 77, when there is no working ptxas (the notice is printed)")
    ap.add_argument("--quiet", action="store_true", help="a one-line summary instead of the table")
    args = ap.parse_args(argv)

    sms = []
    for s in args.sm or ["80,90"]:
        for x in s.replace("sm_", "").split(","):
            if x.strip():
                sms.append(int(x))
    libs = list(args.libs)
    extent = args.extent
    if args.model:
        for plan in find_plans(args.model):
            kernels, _plan_sm, max_len = read_plan(plan)
            d = os.path.dirname(os.path.dirname(os.path.abspath(plan)))
            for k in kernels:
                a, o = os.path.join(d, "lib%s_cuda.a" % k), os.path.join(d, "%s_cuda.o" % k)
                libs.append(a if os.path.exists(a) or not os.path.exists(o) else o)
            if extent is None and max_len:
                extent = max_len
    if extent is None:
        extent = 512
    if not libs:
        ap.error("no libraries given")

    ptxas = find_ptxas(args.ptxas)
    if not ptxas:
        print("ptxas_check: ptxas not found (looked %s): CUDA kernels not assembled, check skipped"
              % ("at " + args.ptxas if args.ptxas else
                 "on PATH, in $CUDA_HOME/bin, $CUDA_PATH/bin and /usr/local/cuda/bin"))
        return 0 if args.skip_ok else SKIP
    version, allowed = ptxas_info(ptxas)
    if not version:
        print("ptxas_check: %s does not run (`ptxas --version` failed): CUDA kernels not assembled, "
              "check skipped" % ptxas)
        return 0 if args.skip_ok else SKIP

    work = args.work or tempfile.mkdtemp(prefix="ptxas_check.")
    os.makedirs(work, exist_ok=True)
    failures, warnings, notes = [], [], []
    launch_problems = []  # failures with --strict, else warnings: the launch is for the report
    too_new = {}  # (sm, PTX target sm) -> kernels whose PTX cannot run on that sm
    report = dict(ptxas=ptxas, ptxas_version=version, sms=sms, extent=extent, kernels=[])
    for sm in sms:
        if allowed and sm not in allowed:
            notes.append("this ptxas (%s) cannot assemble for sm_%d (it knows sm_%s): sm_%d not checked"
                         % (version or ptxas, sm, ", sm_".join(map(str, allowed)), sm))
    sms_run = [sm for sm in sms if not allowed or sm in allowed]

    for lib in libs:
        name = kernel_name(lib)
        kname = name[:-5] if name.endswith("_cuda") else name
        kinfo = dict(kernel=kname, library=os.path.abspath(lib), entries=[])
        report["kernels"].append(kinfo)
        if not os.path.isfile(lib):
            failures.append("%s: %s does not exist" % (kname, lib))
            continue
        with open(lib, "rb") as f:
            data = f.read()
        mods = [data.decode("utf-8", "replace")] if lib.endswith(".ptx") else extract_ptx(data)
        if not mods:
            failures.append("%s: no PTX in %s (a CUDA kernel that fell back to the host?)" % (kname, lib))
            continue
        # launch configuration from the lowered statement
        launches, stmt_text = None, None
        if not args.no_launch and not lib.endswith(".ptx"):
            stmt = os.path.join(args.stmt_dir or os.path.dirname(os.path.abspath(lib)), name + ".stmt")
            kinfo["stmt"] = stmt
            if not os.path.isfile(stmt):
                launch_problems.append("%s: no lowered statement %s (for the block size and shared "
                                       "memory; --no-launch to skip)" % (kname, stmt))
            else:
                with open(stmt, encoding="utf-8", errors="replace") as f:
                    stmt_text = f.read()
                stale = [i for i, m in enumerate(mods) if m not in stmt_text]
                if stale:
                    launch_problems.append("%s: %s is not the statement of %s (its PTX differs: stale?)"
                                           % (kname, stmt, lib))
                    stmt_text = None
                else:
                    try:
                        launches = collect_launches(stmt_text, extent,
                                                    [e for m in mods for e in ENTRY_RE.findall(m)])
                    except (Unknown, ValueError) as e:
                        launch_problems.append("%s: cannot evaluate the launch in %s: %s" % (kname, stmt, e))
        for mi, ptx in enumerate(mods):
            stem = name if len(mods) == 1 else "%s.%d" % (name, mi)
            ptx_path = os.path.join(work, stem + ".ptx")
            with open(ptx_path, "w") as f:
                f.write(ptx)
            entries = ENTRY_RE.findall(ptx)
            tgt = TARGET_RE.search(ptx)
            ptx_sm = int(tgt.group(1)) if tgt else None
            if not entries:
                failures.append("%s: its PTX has no kernel entry" % kname)
            per_sm = {}
            for sm in sms_run:
                if ptx_sm and sm < ptx_sm:
                    too_new.setdefault((sm, ptx_sm), []).append(kname)
                    continue
                rc, log, funcs = run_ptxas(ptxas, ptx_path, sm, os.path.join(work, "%s.sm_%d.cubin" % (stem, sm)))
                with open(os.path.join(work, "%s.sm_%d.log" % (stem, sm)), "w") as f:
                    f.write(log)
                if rc != 0:
                    errs = [ln.strip() for ln in log.splitlines() if "error" in ln or "fatal" in ln] or [log.strip()]
                    failures.append("%s: ptxas failed for sm_%d (%s):\n      %s"
                                    % (kname, sm, ptx_path, "\n      ".join(errs)))
                    continue
                per_sm[sm] = funcs
                for fn, st in funcs.items():
                    if st.get("spill_stores", 0) or st.get("spill_loads", 0):
                        what = "kernel" if st.get("entry") else "function"
                        failures.append("%s: %s %s spills on sm_%d: %d bytes spill stores, %d bytes spill "
                                        "loads (%d registers)" % (kname, what, fn, sm, st["spill_stores"],
                                                                  st["spill_loads"], st.get("registers", 0)))
            for ent in entries:
                row = dict(entry=ent)
                la = launches.get(ent) if launches is not None else None
                if launches is not None and la is None:
                    launch_problems.append("%s: no launch of %s in its statement" % (kname, ent))
                if la:
                    t = la["threads"]
                    row.update(threads=t, threads_per_block=t[0] * t[1] * t[2], blocks=la["blocks"],
                               dynamic_smem=la["dynamic_smem"], launch_extent=la["launch_extent"])
                    if row["threads_per_block"] > MAX_THREADS_BLOCK:
                        failures.append("%s: %s launches %d threads per block (> 1024)"
                                        % (kname, ent, row["threads_per_block"]))
                    # does the shared memory grow with the dynamic extent?
                    try:
                        n = la["launch_extent"]
                        grows = n == extent and \
                            launches_from_stmt(stmt_text, n * 2)[ent]["dynamic_smem"] > la["dynamic_smem"]
                    except (Unknown, KeyError, ValueError):
                        grows = False
                    row["smem_grows_with_extent"] = grows
                    if grows:
                        row["max_extent_within_48k"] = smem_limit_extent(stmt_text, ent, extent)
                for sm, funcs in per_sm.items():
                    st = dict(funcs.get(ent, {}))
                    st.pop("entry", None)
                    if la:
                        smem = st.get("static_smem", 0) + la["dynamic_smem"]
                        st["smem_per_block"] = smem
                        st["occupancy"] = occupancy(sm, row["threads_per_block"], st.get("registers", 0),
                                                    st.get("static_smem", 0), la["dynamic_smem"], st.get("barriers", 0))
                    row["sm_%d" % sm] = st
                if la:
                    smem = la["dynamic_smem"] + max([row["sm_%d" % s].get("static_smem", 0) for s in per_sm] or [0])
                    if smem > SMEM_PER_BLOCK_DEFAULT:
                        lim = row.get("max_extent_within_48k")
                        warnings.append("%s: %s needs %d bytes of shared memory per block at extent %d: more than "
                                        "48 KB, the launch would fail%s" % (
                                            kname, ent, smem, extent,
                                            "" if lim is None else " (it fits up to extent %d)" % lim))
                kinfo["entries"].append(row)

    for (sm, ptx_sm), ks in sorted(too_new.items()):
        notes.append("sm_%d not checked for %d kernel(s): their PTX targets sm_%d (%s)"
                     % (sm, len(ks), ptx_sm, ", ".join(ks) if len(ks) <= 3 else ", ".join(ks[:3]) + ", ..."))
    if args.strict:
        failures += launch_problems
    else:
        warnings += [p + " (no block size / occupancy for it)" for p in launch_problems]

    # ---- table
    ok = not failures
    if not args.quiet:
        hdr = ["kernel", "entry", "threads", "smem B"]
        for sm in sms_run:
            hdr += ["regs sm_%d" % sm, "spill", "occ sm_%d" % sm]
        rows = []
        for k in report["kernels"]:
            for e in k["entries"]:
                r = [k["kernel"], e["entry"].replace("_kernel_", "", 1) + (
                         " [extent %d]" % e["launch_extent"] if e.get("launch_extent", extent) != extent else ""),
                     "x".join(str(x) for x in e["threads"]) if "threads" in e else "?",
                     "-" if "dynamic_smem" not in e else str(e["dynamic_smem"] + max(
                         [e.get("sm_%d" % s, {}).get("static_smem", 0) for s in sms_run] or [0]))]
                for sm in sms_run:
                    st = e.get("sm_%d" % sm, {})
                    r += [str(st.get("registers", "?")),
                          "%d/%d" % (st.get("spill_stores", 0), st.get("spill_loads", 0)) if st else "?",
                          fmt_occ(st.get("occupancy"))]
                rows.append(r)
        widths = [max(len(x) for x in col) for col in zip(hdr, *rows)] if rows else [len(h) for h in hdr]
        print("ptxas: %s (%s); dynamic extents = %d" % (ptxas, version, extent))
        print("  ".join(h.ljust(w) for h, w in zip(hdr, widths)))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    for n in notes:
        print("note: " + n)
    for w in warnings:
        print("warning: " + w)
    nent = sum(len(k["entries"]) for k in report["kernels"])
    occs = [(e["sm_%d" % sm]["occupancy"]["occupancy"], k["kernel"], sm)
            for k in report["kernels"] for e in k["entries"] for sm in sms_run
            if e.get("sm_%d" % sm, {}).get("occupancy")]
    low = min(occs) if occs else None
    for f in failures:
        print("ptxas_check: FAIL " + f)
    summary = "ptxas_check: %d kernels (%d entries), sm_%s: %s" % (
        len(report["kernels"]), nent, "/sm_".join(map(str, sms_run)) or "-",
        "OK: assembled, no spills" if ok else "%d FAILURE(S)" % len(failures))
    if low is not None:
        summary += "; lowest occupancy %.0f%% (%s, sm_%d)" % (100 * low[0], low[1], low[2])
    if args.json:
        summary += "; details in " + (args.json if ok else failed_json_path(args.json))
    print(summary)
    report["failures"], report["warnings"], report["notes"] = failures, warnings, notes
    if args.json:
        path = args.json if ok else failed_json_path(args.json)
        stale = failed_json_path(args.json) if ok else args.json
        if os.path.exists(stale):
            os.remove(stale)  # a failed check must not leave a result that looks current, and v.v.
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def failed_json_path(p):
    root, ext = os.path.splitext(p)
    return root + ".failed" + (ext or ".json")


if __name__ == "__main__":
    sys.exit(main())
