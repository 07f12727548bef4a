"""The launch configuration of each CUDA kernel, from the pipeline's lowered statement
(`-e stmt`): Halide's PTX carries no block size and gives kernels dynamic shared memory
sized by the host code, so a small evaluator runs the host code around each
halide_cuda_run call (expression parser, statement blocks, a machine with concrete
buffer shapes) and reads blocks, threads and shared memory at a given extent; a
kernel launched only at other sizes is looked for at nearby powers of two, and the
largest extent whose shared memory fits 48 KB is found by bisection."""
import re

from .occupancy import SMEM_PER_BLOCK_DEFAULT

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
