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
import subprocess
import sys
import tempfile

SKIP = 77
SMEM_PER_BLOCK_DEFAULT = 48 * 1024  # without cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)

# ---------------------------------------------------------------------------------------
# Occupancy: the rules of CUDA's cuda_occupancy.h (cudaOccMaxActiveBlocksPerMultiprocessor)
# with the default shared memory carveout and no partitioned global caching.
#   max_threads: threads per SM; max_blocks: resident blocks per SM; smem_sm: shared
#   memory per SM; reserved: shared memory the driver reserves per block (sm_80+);
#   smem_gran: shared memory allocation unit; barrier_mult: barriers per block slot
#   (Hopper and later limit blocks by named barriers too; None: no such limit).
ARCH = {
    75: dict(max_threads=1024, max_blocks=16, smem_sm=64 * 1024, reserved=0, smem_gran=256, barrier_mult=None),
    80: dict(max_threads=2048, max_blocks=32, smem_sm=164 * 1024, reserved=1024, smem_gran=128, barrier_mult=None),
    86: dict(max_threads=1536, max_blocks=16, smem_sm=100 * 1024, reserved=1024, smem_gran=128, barrier_mult=None),
    87: dict(max_threads=2048, max_blocks=16, smem_sm=164 * 1024, reserved=1024, smem_gran=128, barrier_mult=None),
    89: dict(max_threads=1536, max_blocks=24, smem_sm=100 * 1024, reserved=1024, smem_gran=128, barrier_mult=None),
    90: dict(max_threads=2048, max_blocks=32, smem_sm=228 * 1024, reserved=1024, smem_gran=128, barrier_mult=2),
    100: dict(max_threads=2048, max_blocks=32, smem_sm=228 * 1024, reserved=1024, smem_gran=128, barrier_mult=2),
    103: dict(max_threads=2048, max_blocks=32, smem_sm=228 * 1024, reserved=1024, smem_gran=128, barrier_mult=2),
    120: dict(max_threads=1536, max_blocks=24, smem_sm=100 * 1024, reserved=1024, smem_gran=128, barrier_mult=1),
    121: dict(max_threads=1536, max_blocks=24, smem_sm=100 * 1024, reserved=1024, smem_gran=128, barrier_mult=1),
}
WARP = 32
REGS_SM = 65536          # registers per SM (and per block)
REG_UNIT = 256           # register allocation unit, per warp
SUBPARTITIONS = 4        # registers are split over 4 SM sub-partitions
MAX_THREADS_BLOCK = 1024


def round_up(x, unit):
    return -(-x // unit) * unit


def occupancy(sm, threads, regs, smem_static, smem_dynamic, barriers=0):
    """Theoretical occupancy of one kernel on sm_<sm>; None where the arch is unknown."""
    a = ARCH.get(sm)
    if a is None or threads <= 0:
        return None
    max_warps = a["max_threads"] // WARP
    warps_block = -(-threads // WARP)
    limits = {}
    # warps
    limits["warps"] = 0 if threads > MAX_THREADS_BLOCK else max_warps // warps_block
    # registers: per warp, rounded to the allocation unit; warps fit per sub-partition
    regs_warp = round_up(max(regs, 1) * WARP, REG_UNIT)
    if regs_warp * round_up(warps_block, SUBPARTITIONS) > REGS_SM or regs > 255:
        limits["registers"] = 0
    else:
        warps_sm = (REGS_SM // SUBPARTITIONS // regs_warp) * SUBPARTITIONS
        limits["registers"] = warps_sm // warps_block
    # blocks per SM
    limits["blocks"] = a["max_blocks"]
    # shared memory: static + dynamic + the driver's reserve, in allocation units
    smem_block = round_up(smem_static + smem_dynamic + a["reserved"], a["smem_gran"])
    if smem_static + smem_dynamic > SMEM_PER_BLOCK_DEFAULT:
        limits["shared memory"] = 0
    else:
        limits["shared memory"] = a["smem_sm"] // smem_block if smem_block else 10**9
    if a["barrier_mult"] and barriers:
        limits["barriers"] = a["max_blocks"] * a["barrier_mult"] // barriers
    blocks = min(limits.values())
    limiters = [k for k, v in limits.items() if v == blocks]
    warps = blocks * warps_block
    return dict(active_blocks=blocks, active_warps=warps, max_warps=max_warps,
                occupancy=warps / max_warps, limiters=limiters,
                limits={k: (v if v < 10**9 else None) for k, v in limits.items()},
                smem_allocated_per_block=smem_block)


# ---------------------------------------------------------------------------------------
# PTX extraction

PTX_RE = re.compile(rb"//\n// Generated by LLVM NVPTX Back-End\n[^\0]*")
PTX_FALLBACK_RE = re.compile(rb"(?m)^\.version \d+\.\d+\s*\n\s*\.target sm_\d+[^\0]*")
ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)")
TARGET_RE = re.compile(r"^\s*\.target\s+sm_(\d+)", re.M)


def extract_ptx(data):
    """The PTX modules embedded in an object/archive (NUL-terminated text), in order."""
    mods = [m.group(0) for m in PTX_RE.finditer(data)]
    if not mods:
        mods = [m.group(0) for m in PTX_FALLBACK_RE.finditer(data)]
    out = []
    for m in mods:
        text = m.decode("utf-8", "replace")
        if text not in out:
            out.append(text)
    return out


def kernel_name(path):
    base = os.path.basename(path)
    for ext in (".a", ".o", ".ptx"):
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    if base.startswith("lib") and path.endswith(".a"):
        base = base[3:]
    return base


# ---------------------------------------------------------------------------------------
# ptxas

def find_ptxas(explicit=None):
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    cands = [shutil.which("ptxas")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            cands.append(os.path.join(os.environ[var], "bin", "ptxas"))
    cands.append("/usr/local/cuda/bin/ptxas")
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def ptxas_info(ptxas):
    def out(args):
        try:
            r = subprocess.run([ptxas] + args, capture_output=True, text=True, timeout=60)
            return r.stdout + r.stderr
        except (OSError, subprocess.SubprocessError):
            return ""
    version = ""
    for line in out(["--version"]).splitlines():
        if "release" in line:
            version = line.strip()
    allowed = sorted({int(m) for m in re.findall(r"'sm_(\d+)'", out(["--help"]))})
    return version, allowed


def run_ptxas(ptxas, ptx_path, sm, cubin_path):
    cmd = [ptxas, "-v", "--gpu-name", "sm_%d" % sm, "-o", cubin_path, ptx_path]
    r = subprocess.run(cmd, capture_output=True, text=True)
    log = r.stdout + r.stderr
    funcs = {}
    cur = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur = funcs.setdefault(m.group(1), {"entry": True})
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), {"entry": False})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            cur["stack_frame"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur["registers"] = int(m.group(1))
            for key, pat in (("barriers", r"used (\d+) barriers"), ("static_smem", r"(\d+) bytes smem"),
                             ("cmem0", r"(\d+) bytes cmem\[0\]")):
                mm = re.search(pat, line)
                cur[key] = int(mm.group(1)) if mm else 0
    return r.returncode, log, funcs


# ---------------------------------------------------------------------------------------
# The lowered statement: a small evaluator for the host code around halide_cuda_run.

class Unknown(Exception):
    pass


TOKEN_RE = re.compile(r"""\s*(?:
    (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<num>\d+\.\d*(?:e[-+]?\d+)?f?|\d+e[-+]?\d+f?|\d+)
  | (?P<cast>\((?:struct\s+\w+(?:\s+const)?\s*\*|void\s*\*|(?:u?int|float|bfloat)\d+(?:x\d+)?|bool)\))
  | (?P<name>[A-Za-z_][\w$]*(?:\.[\w$]+)*)
  | (?P<op><<|>>|<=|>=|==|!=|&&|\|\||[-+*/%<>!~&|^()\[\],{}?:=])
  )""", re.X)

BINOPS = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, "<=": 7, ">": 7,
          ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10}


def tokenize(s):
    toks, pos = [], 0
    s = s.rstrip()
    while pos < len(s):
        m = TOKEN_RE.match(s, pos)
        if not m or m.end() == pos:
            if s[pos:].strip() == "":
                break
            raise ValueError("cannot tokenize at %r" % s[pos:pos + 30])
        pos = m.end()
        kind = m.lastgroup
        toks.append((kind, m.group(kind)))
    return toks


class Parser:
    def __init__(self, text):
        self.t = tokenize(text)
        self.i = 0

    def peek(self, k=0):
        return self.t[self.i + k] if self.i + k < len(self.t) else (None, None)

    def take(self, val=None):
        tok = self.peek()
        if val is not None and tok[1] != val:
            raise ValueError("expected %r, got %r" % (val, tok[1]))
        self.i += 1
        return tok

    def done(self):
        return self.i >= len(self.t)

    def expr(self, minp=1):
        lhs = self.unary()
        while True:
            kind, v = self.peek()
            if kind != "op" or v not in BINOPS or BINOPS[v] < minp:
                return lhs
            self.take()
            rhs = self.expr(BINOPS[v] + 1)
            lhs = ("bin", v, lhs, rhs)

    def unary(self):
        kind, v = self.peek()
        if kind == "op" and v in ("-", "!", "~"):
            self.take()
            return ("un", v, self.unary())
        if kind == "cast":
            self.take()
            return ("cast", v, self.unary())
        return self.postfix(self.primary())

    def postfix(self, e):
        while self.peek()[1] == "[":
            self.take("[")
            idx = self.expr()
            self.take("]")
            e = ("load", e, idx)
        return e

    def primary(self):
        kind, v = self.take()
        if kind == "num":
            if v.endswith("f") or "." in v or "e" in v:
                return ("const", float(v.rstrip("f")))
            return ("const", int(v))
        if kind == "str":
            return ("const", v[1:-1])
        if kind == "op" and v == "(":
            e = self.expr()
            self.take(")")
            return e
        if kind == "name":
            if v == "let":
                name = self.take()[1]
                self.take("=")
                val = self.expr()
                if self.take()[1] != "in":
                    raise ValueError("let without in")
                return ("let", name, val, self.expr())
            if v == "reinterpret" and self.peek()[1] == "<":
                depth = 0
                while True:
                    t = self.take()[1]
                    depth += {"<": 1, ">": -1}.get(t, 0)
                    if depth == 0:
                        break
            if self.peek()[1] == "(":
                self.take("(")
                args = []
                if self.peek()[1] != ")":
                    args.append(self.expr())
                    while self.peek()[1] == ",":
                        self.take(",")
                        args.append(self.expr())
                self.take(")")
                return ("call", v, args)
            return ("var", v)
        raise ValueError("unexpected %r" % v)


def parse_expr(text):
    p = Parser(text)
    e = p.expr()
    if not p.done():
        raise ValueError("trailing tokens in %r" % text[:80])
    return e


def buffer_name(arg):
    while arg[0] == "cast":
        arg = arg[2]
    if arg[0] == "var" and arg[1].endswith(".buffer"):
        return arg[1][: -len(".buffer")]
    raise Unknown("buffer argument")


class Machine:
    """Runs the host side of one lowered pipeline with concrete buffer shapes: every
    dimension constrained by the pipeline (halide_error_constraint_violated asserts) takes
    its value; every other extent is `extent`, every other min 0."""

    def __init__(self, text, extent):
        self.extent = extent
        self.fixed = {m.group(1): int(m.group(2)) for m in re.finditer(
            r'halide_error_constraint_violated\("([^"]+)", [^"]*"[^"]*", (-?\d+)\)', text)}
        self.env = {}
        self.arrays = {}
        self.launches = {}
        self.iterations = 0

    # -- buffers
    def buf_field(self, buf, field, dim):
        key = "%s.%s.%d" % (buf, field, dim)
        if key in self.fixed:
            return self.fixed[key]
        if field == "extent":
            return self.extent
        if field == "min":
            return 0
        if field == "stride":
            s = 1
            for d in range(dim):
                s *= self.buf_field(buf, "extent", d)
            return s
        raise Unknown(key)

    # -- expressions
    def ev(self, e):
        k = e[0]
        if k == "const":
            return e[1]
        if k == "var":
            if e[1] in self.env:
                v = self.env[e[1]]
                if v is Unknown:
                    raise Unknown(e[1])
                return v
            if e[1] in self.fixed:
                return self.fixed[e[1]]
            raise Unknown(e[1])
        if k == "cast":
            v = self.ev(e[2])
            if not isinstance(v, (int, float)):
                raise Unknown("cast")
            if re.match(r"\(u?int\d+\)|\(bool\)", e[1]):
                return int(v)
            if e[1].startswith("(float"):
                return float(v)
            raise Unknown("pointer cast")
        if k == "un":
            v = self.ev(e[2])
            return {"-": lambda x: -x, "!": lambda x: int(not x), "~": lambda x: ~x}[e[1]](v)
        if k == "bin":
            op = e[1]
            if op == "&&":
                return int(bool(self.ev(e[2])) and bool(self.ev(e[3])))
            if op == "||":
                return int(bool(self.ev(e[2])) or bool(self.ev(e[3])))
            a, b = self.ev(e[2]), self.ev(e[3])
            if isinstance(a, str) or isinstance(b, str):
                raise Unknown("string arithmetic")
            return binop(op, a, b)
        if k == "let":
            saved = self.env.get(e[1], None), e[1] in self.env
            try:
                self.env[e[1]] = self.ev(e[2])
            except Unknown:
                self.env[e[1]] = Unknown
            try:
                return self.ev(e[3])
            finally:
                if saved[1]:
                    self.env[e[1]] = saved[0]
                else:
                    del self.env[e[1]]
        if k == "load":
            if e[1][0] != "var" or e[1][1] not in self.arrays:
                raise Unknown("load")
            v = self.arrays[e[1][1]].get(self.ev(e[2]), Unknown)
            if v is Unknown:
                raise Unknown("load")
            return v
        if k == "call":
            return self.call(e[1], e[2])
        raise Unknown(k)

    def call(self, f, args):
        if f in ("min", "max"):
            vals = [self.ev(a) for a in args]
            return min(vals) if f == "min" else max(vals)
        if f == "select":
            return self.ev(args[1]) if self.ev(args[0]) else self.ev(args[2])
        if f == "abs":
            return abs(self.ev(args[0]))
        if f in ("likely", "likely_if_innermost", "promise_clamped", "unsafe_promise_clamped",
                 "strict_float") or re.fullmatch(r"u?int\d+|float\d+", f):
            return self.ev(args[0])
        if f == "shift_left":
            return self.ev(args[0]) << self.ev(args[1])
        if f == "shift_right":
            return self.ev(args[0]) >> self.ev(args[1])
        if f in ("bitwise_and", "bitwise_or", "bitwise_xor"):
            return binop({"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}[f],
                         self.ev(args[0]), self.ev(args[1]))
        if f == "_halide_buffer_is_bounds_query":
            return 0
        m = re.fullmatch(r"_halide_buffer_get_(extent|min|stride)", f)
        if m:
            return self.buf_field(buffer_name(args[0]), m.group(1), self.ev(args[1]))
        raise Unknown(f)

    # -- statements
    def launch(self, e):
        """Records a halide_cuda_run call found anywhere in e."""
        if e[0] == "call" and e[1] == "halide_cuda_run":
            a = e[2]
            name = self.ev(a[1])

            def val(x, required):
                try:
                    return int(self.ev(x))
                except Unknown as u:
                    if required:
                        raise Unknown("%s of %s (%s)" % (required, name, u))
                    return None
            rec = dict(blocks=[val(x, None) for x in a[2:5]],
                       threads=[val(x, "threads") for x in a[5:8]],
                       dynamic_smem=val(a[8], "shared memory size"))
            old = self.launches.get(name)
            if old is None:
                self.launches[name] = rec
            else:  # launched more than once: the largest configuration
                old["threads"] = max(old["threads"], rec["threads"], key=lambda t: t[0] * t[1] * t[2])
                old["dynamic_smem"] = max(old["dynamic_smem"], rec["dynamic_smem"])
            return True
        found = False
        for x in e[1:]:
            if isinstance(x, tuple):
                found |= self.launch(x)
            elif isinstance(x, list):
                for y in x:
                    if isinstance(y, tuple):
                        found |= self.launch(y)
        return found

    def run(self, stmts):
        for st in stmts:
            if st[0] == "line":
                self.line(st[1])
            else:
                self.block(st)

    def line(self, s):
        if s.startswith("assert(") or s.startswith("free ") or s.startswith("buffer "):
            return
        m = re.match(r"let ([\w$.]+) = (.*)$", s)
        if m:
            e = parse_expr(m.group(2))
            if "halide_cuda_run(" in m.group(2) and self.launch(e):
                self.env[m.group(1)] = 0
                return
            try:
                self.env[m.group(1)] = self.ev(e)
            except Unknown:
                self.env[m.group(1)] = Unknown
            return
        m = re.match(r"allocate ([\w$.]+)\[", s)
        if m:
            self.arrays[m.group(1)] = {}
            return
        m = re.match(r"([\w$.]+)\[(.*)\] = (.*)$", s)
        if m and m.group(1) in self.arrays:
            try:
                idx = self.ev(parse_expr(m.group(2)))
            except Unknown:
                return
            try:
                self.arrays[m.group(1)][idx] = self.ev(parse_expr(m.group(3)))
            except Unknown:
                self.arrays[m.group(1)][idx] = Unknown
            return
        if "halide_cuda_run(" in s:
            self.launch(parse_expr(s))

    def block(self, st):
        _, head, body, orelse = st
        m = re.match(r"^(?:[\w<>]+\s+)*for\s*\((.*)\)$", head)
        if m:
            p = Parser(m.group(1))
            var = p.take()[1]
            p.take(",")
            lo = p.expr()
            p.take(",")
            n = p.expr()
            try:
                lo, n = int(self.ev(lo)), int(self.ev(n))
            except Unknown:
                return  # a loop of unknown length: nothing the launch needs, or it fails later
            if n <= 0:
                return
            # A body that does not use the loop variable and only takes maxima (Halide's
            # shared-size computation) gives the same result every iteration: run it once.
            text = body_text(body)
            uses = re.search(r"(?<![\w$.])" + re.escape(var) + r"(?![\w$]|\.\w)", text)
            idempotent = all(re.match(r"([\w$.]+)\[.*\] = max\(\1\[", ln)
                             for ln in text.splitlines() if re.match(r"[\w$.]+\[.*\] = ", ln))
            rng = range(lo, lo + (1 if (not uses and idempotent) else n))
            for v in rng:
                self.iterations += 1
                if self.iterations > 2000000:
                    raise Unknown("too many loop iterations")
                self.env[var] = v
                self.run(body)
            return
        m = re.match(r"^if\s*\((.*)\)$", head)
        if m:
            try:
                c = self.ev(parse_expr(m.group(1)))
            except Unknown:
                c = None
            if c is None or c:
                self.run(body)
            if orelse is not None and (c is None or not c):
                self.run(orelse)
            return
        self.run(body)  # produce / consume / other blocks


def body_text(stmts):
    out = []
    for st in stmts:
        if st[0] == "line":
            out.append(st[1])
        else:
            out.append(st[1])
            out.append(body_text(st[2]))
            if st[3]:
                out.append(body_text(st[3]))
    return "\n".join(out)


def parse_block(lines, i):
    stmts = []
    while i < len(lines):
        s = lines[i].strip()
        if s == "}" or s.startswith("} else"):
            return stmts, i
        if s.endswith("{"):
            body, j = parse_block(lines, i + 1)
            orelse, j = parse_else(lines, j)
            stmts.append(("block", s[:-1].strip(), body, orelse))
            i = j + 1
        else:
            if s:
                stmts.append(("line", s))
            i += 1
    return stmts, i


def parse_else(lines, j):
    if j >= len(lines):
        return None, j
    s = lines[j].strip()
    if s == "} else {":
        body, k = parse_block(lines, j + 1)
        return body, k
    m = re.match(r"\} else (if .*)\{$", s)
    if m:
        body, k = parse_block(lines, j + 1)
        orelse, k = parse_else(lines, k)
        return [("block", m.group(1).strip(), body, orelse)], k
    return None, j


def stmt_funcs(text):
    """The function bodies of a .stmt file (the PTX buffer before them is skipped)."""
    lines = text.split("\n")
    funcs = []
    i = 0
    while i < len(lines):
        if re.match(r"^(?:\w+ )*func \S+ \(.*\) \{$", lines[i]):
            body, j = parse_block(lines, i + 1)
            funcs.append(body)
            i = j + 1
        else:
            i += 1
    return funcs


def launches_from_stmt(text, extent):
    """{entry: {threads: [x, y, z], blocks: [...], dynamic_smem: bytes}} at `extent`."""
    m = Machine(text, extent)
    for body in stmt_funcs(text):
        m.run(body)
    return m.launches


def collect_launches(text, extent, entries=(), cap=1 << 16):
    """Launches at `extent`, and of kernels not launched there (specializations picked by
    size, e.g. a few-rows decode path or a many-rows path), at the nearest power of two
    that launches them: first downwards, then upwards (rows = batch x sequence can exceed
    max_len) up to `cap`, until every name in `entries` is found. Adds launch_extent."""
    out = {}
    sizes = [extent]
    n = extent
    while n > 1:
        n = 1 << ((n - 1).bit_length() - 1)  # the largest power of two below n
        sizes.append(n)
    n = 1 << extent.bit_length()  # the smallest power of two above extent
    while n <= cap:
        sizes.append(n)
        n *= 2
    for i, n in enumerate(sizes):
        if n > extent and all(e in out for e in entries):
            break
        for name, rec in launches_from_stmt(text, n).items():
            if name not in out:
                rec["launch_extent"] = n
                out[name] = rec
    return out


def smem_limit_extent(text, entry, start, limit=SMEM_PER_BLOCK_DEFAULT, cap=1 << 14):
    """The largest extent at which `entry`'s shared memory fits in `limit` bytes (its
    shared memory grows with the extent), or None if it still fits at `cap`."""
    def smem(n):
        try:
            return launches_from_stmt(text, n)[entry]["dynamic_smem"]
        except (Unknown, KeyError, ValueError):
            return None
    lo = 1
    if smem(lo) is None or smem(lo) > limit:
        return 0
    hi = max(start, 2)
    while smem(hi) is not None and smem(hi) <= limit:
        lo = hi
        hi *= 2
        if hi > cap:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        s = smem(mid)
        if s is not None and s <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def binop(op, a, b):
    if op in ("/", "%") and isinstance(a, int) and isinstance(b, int):
        if b == 0:
            return 0  # Halide defines x / 0 == 0 and x % 0 == 0
        q = a // b if b > 0 else -(a // -b)  # Euclidean: the remainder is never negative
        return q if op == "/" else a - q * b
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
            "%": lambda: a % b, "<": lambda: int(a < b), "<=": lambda: int(a <= b),
            ">": lambda: int(a > b), ">=": lambda: int(a >= b), "==": lambda: int(a == b),
            "!=": lambda: int(a != b), "<<": lambda: a << b, ">>": lambda: a >> b,
            "&": lambda: a & b, "|": lambda: a | b, "^": lambda: a ^ b}[op]()


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
