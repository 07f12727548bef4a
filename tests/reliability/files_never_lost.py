#!/usr/bin/env python3
"""Files are never lost (issue 8, item 4): `halformer build` never writes the user's spec,
and an interrupted build leaves the previous binary usable.

usage: files_never_lost.py HALFORMER SPEC WEIGHTS [--known-issues]

Works on a copy of SPEC (a model whose weights WEIGHTS decode "3 7 1 9" to
"9 1 7 3 15", i.e. models/reverse-tiny.yaml) in a temporary directory:
  1. check + build + no-op rebuild: the spec's bytes, mtime, inode and its directory are
     unchanged; the rebuild leaves the binary untouched;
  2. the user edits the spec (a schedule knob: kernels regenerate, same results) and
     presses Ctrl-C (SIGINT to the build's process group) while the kernels are being
     generated: the previous binary and library are byte-identical and still run;
  3. the build is re-run to completion: the new binary runs;
  4. `-o` such that DIR/<name> is the spec itself: refused, the spec survives; `-o` naming
     the spec file: the spec survives.
--known-issues runs the checks that fail today (tests/reliability/README.md, "Known
issues"; registered as a disabled test until fixed):
  K1. Ctrl-C while the binary is being linked keeps the previous binary;
  K2. `-o` naming an existing file exits with a message instead of aborting.
"""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

args = [a for a in sys.argv[1:] if not a.startswith("--")]
if len(args) != 3:
    sys.exit(__doc__)
HALFORMER, SPEC, WEIGHTS = (os.path.abspath(a) for a in args)
KNOWN = "--known-issues" in sys.argv
tmp = tempfile.mkdtemp(prefix="halformer-files-")
spec_dir = os.path.join(tmp, "spec")
os.makedirs(spec_dir)
spec = os.path.join(spec_dir, "reverse-tiny.yaml")
shutil.copyfile(SPEC, spec)
out = os.path.join(tmp, "out")
binary, lib = os.path.join(out, "reverse-tiny"), os.path.join(out, "libreverse-tiny.a")
failures = []
checks = 0


def check(ok, what):
    global checks
    checks += 1
    print(f"[{'ok' if ok else 'FAIL'}] {what}")
    if not ok:
        failures.append(what)
    return ok


def fingerprint(path):
    st = os.stat(path)
    return (hashlib.sha256(open(path, "rb").read()).hexdigest(), st.st_mtime_ns, st.st_ino, st.st_size,
            st.st_mode)


def listing(d):
    return sorted(os.listdir(d))


def build(*extra, **kw):
    return subprocess.run([HALFORMER, "build", spec, "-o", out, *extra], capture_output=True, text=True,
                          timeout=300, **kw)


def decodes(path=binary):
    try:
        r = subprocess.run([path, "--weights", WEIGHTS, "--src", "3 7 1 9"], capture_output=True, text=True,
                           timeout=30)
    except OSError as e:
        return f"cannot run: {e}"
    return r.stdout if r.returncode == 0 else f"exit {r.returncode}: {r.stderr.strip()}"


def session_processes(sid):
    """Command lines of the processes still alive in session `sid`."""
    alive = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.getsid(int(pid)) == sid:
                alive.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return alive


def interrupt_when(marker, sig=signal.SIGINT):
    """Starts a build; when a process whose command line contains `marker` (and the output
    directory) appears, sends `sig` to the whole build (as Ctrl-C does). Returns
    (interrupted, build exit status). Checks that halformer exits only after the whole
    build has (a re-run must never race the interrupted ninja)."""
    p = subprocess.Popen([HALFORMER, "build", spec, "-o", out], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while p.poll() is None and time.time() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
                if marker(cmd) and os.getsid(int(pid)) == p.pid:
                    os.killpg(p.pid, sig)
                    rc = p.wait()
                    left = [c for c in session_processes(p.pid) if c]
                    check(not left, "halformer exits only after the interrupted build's processes have"
                          + ("" if not left else f"; still running: {left}"))
                    return True, rc
            except (OSError, ProcessLookupError):
                continue
        time.sleep(0.002)
    return False, p.wait()


def edit_spec(tile_m):
    text = open(spec).read().split("\nschedule:")[0].rstrip("\n")
    with open(spec, "w") as f:
        f.write(text + f"\nschedule:\n  linear.tile_m: {tile_m}\n")
    return fingerprint(spec)


try:
    # ---- 1. check, build, no-op rebuild never write the spec
    before, dir_before = fingerprint(spec), listing(spec_dir)
    r = subprocess.run([HALFORMER, "check", spec], capture_output=True, text=True)
    check(r.returncode == 0, "halformer check succeeds")
    r = build()
    check(r.returncode == 0, "halformer build succeeds" + ("" if r.returncode == 0 else f": {r.stderr[-2000:]}"))
    check(fingerprint(spec) == before, "build: spec bytes, mtime, inode and mode unchanged")
    check(listing(spec_dir) == dir_before, "build: nothing written next to the spec")
    check(decodes() == "9 1 7 3 15\n", "built binary decodes")
    bin_before, lib_before = fingerprint(binary), fingerprint(lib)
    r = build()
    check(r.returncode == 0 and fingerprint(binary) == bin_before and fingerprint(lib) == lib_before,
          "no-op rebuild leaves the binary and the library untouched")
    check(fingerprint(spec) == before, "no-op rebuild: spec unchanged")

    # ---- 2. the user edits the spec, then interrupts the rebuild while kernels are generated
    edited = edit_spec(4)
    hit, rc = interrupt_when(lambda cmd: "halformer_generators" in cmd and out in cmd)
    check(hit, "build interrupted (SIGINT) during kernel generation")
    check(rc != 0 or not hit, f"interrupted build exits non-zero (exit {rc})")
    check(fingerprint(spec) == edited, "interrupted build: spec unchanged")
    check(fingerprint(binary) == bin_before, "interrupted build: previous binary byte-identical")
    check(fingerprint(lib) == lib_before, "interrupted build: previous library byte-identical")
    check(decodes() == "9 1 7 3 15\n", "interrupted build: previous binary still decodes")

    # ---- 3. re-run to completion
    r = build()
    check(r.returncode == 0, "re-run after the interrupt succeeds" +
          ("" if r.returncode == 0 else f": {r.stdout[-3000:]}\n{r.stderr[-2000:]}"))
    check(decodes() == "9 1 7 3 15\n", "rebuilt binary decodes")
    check(fingerprint(spec) == edited, "re-run: spec unchanged")

    # ---- 3b. two builds into one directory at once: the second waits for the first
    edit_spec(2)
    first = subprocess.Popen([HALFORMER, "build", spec, "-o", out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    time.sleep(0.3)
    r = build()
    first_out = first.communicate(timeout=300)[0]
    check(first.returncode == 0 and r.returncode == 0, "two concurrent builds into one directory both succeed"
          + ("" if first.returncode == 0 and r.returncode == 0 else f": {first_out[-1500:]}\n{r.stdout[-1500:]}"))
    check("waiting for it to finish" in r.stdout + first_out, "... one of them said it waits for the other")
    check(decodes() == "9 1 7 3 15\n", "... and the binary decodes")
    edited = edit_spec(4)

    # ---- 4. output paths that collide with the spec
    named = os.path.join(spec_dir, "reverse-tiny")  # DIR/<name> is the spec itself
    shutil.copyfile(SPEC, named)
    named_before = fingerprint(named)
    r = subprocess.run([HALFORMER, "build", named, "-o", spec_dir], capture_output=True, text=True, timeout=300)
    check(r.returncode != 0, f"build whose output binary is the spec itself is refused (exit {r.returncode})")
    check(fingerprint(named) == named_before, "... and the spec survives")
    r = subprocess.run([HALFORMER, "build", spec, "-o", spec], capture_output=True, text=True, timeout=300)
    check(r.returncode != 0, f"build with -o naming the spec file fails (exit {r.returncode})")
    check(fingerprint(spec) == edited, "... and the spec survives")

    if KNOWN:
        # K2. -o naming an existing file: a message, not an abort (std::terminate).
        check(0 < r.returncode < 128 and "terminate called" not in r.stderr,
              f"K2: -o naming a file exits with a message (exit {r.returncode}: {r.stderr.strip()[:200]})")
        # K1. Ctrl-C during the link of the binary keeps the previous binary.
        bin_before = fingerprint(binary)
        edit_spec(2)
        # The binary is linked inside the build tree, then installed by copy + rename.
        linked = os.path.join(out, ".halformer", "build", "reverse-tiny")
        hit, rc = interrupt_when(lambda cmd: cmd.startswith(("/usr/bin/ld", "ld ", "/usr/bin/x86_64-linux-gnu-ld"))
                                 and linked in cmd)
        check(hit, "K1: build interrupted (SIGINT) while linking the binary")
        check(os.path.exists(binary) and decodes() == "9 1 7 3 15\n",
              "K1: interrupted link: previous binary still decodes")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print(f"{checks} checks, {len(failures)} failures")
if failures:
    print("failed:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
