#!/usr/bin/env python3
"""Bad runtime inputs (issue 8, item 3) against a model's inference binary.

usage: runtime_inputs.py BINARY WEIGHTS

Every case must exit non-zero (not by a signal) and print a message matching its
regex; controls (documented decisions, e.g. blank lines in --src-file are skipped)
must succeed with the given output. The cases complement tests/tools/cli's
runtime_error_* tests (bad_id, negative_id, not_a_number, empty_input, too_long,
zero_new_tokens), which are not repeated here. Needs a model with the reverse-tiny
vocabulary (16 symbols, max_len 64).
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

if len(sys.argv) != 3:
    sys.exit(__doc__)
BIN, WEIGHTS = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="halformer-inputs-")


def path(name, content=None):
    p = os.path.join(tmp, name)
    if content is not None:
        with open(p, "w", newline="") as f:
            f.write(content)
    return p


long65 = " ".join(["3"] * 65)
blank = path("blank.txt", "\n   \n\t\r\n")
empty = path("empty.txt", "")
bad3 = path("bad3.txt", "3 7\n1 2\n3 x 7\n")
long_line = path("long.txt", "3 7\n" + long65 + "\n")
two = path("two.txt", "3 7 1 9\n5 4 3\n")
one_tgt = path("one_tgt.txt", "14 9\n")
crlf = path("crlf.txt", "3 7 1 9\r\n\r\n  \r\n5 4 3\r\n")
weights_copy = path("weights_copy.safetensors")
shutil.copyfile(WEIGHTS, weights_copy)
src_copy = path("src_copy.txt", "3 7 1 9\n")
fifo = path("weights.fifo")
os.mkfifo(fifo)
W = ["--weights", WEIGHTS]
D = ["--dump", path("dump.safetensors")]  # --tgt is only used (and checked) with --dump

# (name, args, regex the output must match). Non-zero exit required.
ERRORS = [
    # token ids
    ("id_equals_vocab", W + ["--src", "3 16"], r"source sequence 1, token 2: id 16 is outside the vocabulary \[0, 16\)"),
    ("id_int32_min", W + ["--src", "-2147483648"], r"id -2147483648 is outside the vocabulary"),
    ("id_beyond_int32", W + ["--src", "3 2147483648"], r"'2147483648' is not a token id"),
    ("id_below_int32", W + ["--src", "-2147483649"], r"'-2147483649' is not a token id"),
    ("id_huge", W + ["--src", "99999999999999999999999"], r"'99999999999999999999999' is not a token id"),
    ("id_fraction", W + ["--src", "3 3.5"], r"--src #1: '3.5' is not a token id"),
    ("id_plus_sign", W + ["--src", "+3"], r"'\+3' is not a token id"),
    ("id_hex", W + ["--src", "0x3"], r"'0x3' is not a token id"),
    ("id_unicode_digit", W + ["--src", "3 \u0663"], r"is not a token id"),
    ("id_in_second_sequence", W + ["--src", "3", "--src", "1 2 99"], r"source sequence 2, token 3: id 99 is outside"),
    # empty batch / zero-length sequences
    ("src_empty_string", W + ["--src", ""], r"source sequence 1 is empty"),
    ("src_only_spaces", W + ["--src", "   "], r"source sequence 1 is empty"),
    ("src_only_commas", W + ["--src", " , ,"], r"source sequence 1 is empty"),
    ("second_src_empty", W + ["--src", "3 7", "--src", ""], r"source sequence 2 is empty"),
    ("src_file_blank_lines_only", W + ["--src-file", blank], r"no (input|source) sequences"),
    ("src_file_empty", W + ["--src-file", empty], r"no (input|source) sequences"),
    ("tgt_without_src", W + ["--tgt", "14 3"], r"no (input|source) sequences"),
    # files of sequences
    ("src_file_bad_token_line3", W + ["--src-file", bad3], re.escape(bad3) + r":3: 'x' is not a token id"),
    ("src_file_missing", W + ["--src-file", path("nope.txt")], r"nope.txt: cannot open"),
    ("src_file_directory", W + ["--src-file", tmp], r"is a directory"),
    ("src_file_line_too_long", W + ["--src-file", long_line], r"source sequence 2 has 65 tokens; the model's max_len is 64"),
    # lengths
    ("src_too_long_in_batch", W + ["--src", "3", "--src", long65], r"source sequence 2 has 65 tokens"),
    ("tgt_too_long", W + ["--src", "3", "--tgt", "14 " + long65] + D, r"target sequence 1 has 66 tokens"),
    # --max-new-tokens
    ("max_new_tokens_max_len_plus_1", W + ["--src", "3", "--max-new-tokens", "65"], r"max_new_tokens 65 is outside \[1, max_len = 64\]"),
    ("max_new_tokens_negative", W + ["--src", "3", "-n", "-1"], r"max_new_tokens -1 is outside"),
    ("max_new_tokens_int_max", W + ["--src", "3", "-n", "2147483647"], r"max_new_tokens 2147483647 is outside"),
    ("max_new_tokens_huge", W + ["--src", "3", "-n", "99999999999"], r"Could not convert: --max-new-tokens = 99999999999"),
    ("max_new_tokens_not_a_number", W + ["--src", "3", "-n", "abc"], r"Could not convert: --max-new-tokens = abc"),
    ("max_new_tokens_empty", W + ["--src", "3", "-n", ""], r"max_new_tokens 0 is outside|--max-new-tokens"),
    # teacher forcing
    ("tgt_more_than_src", W + ["--src", "3", "--tgt", "14 3", "--tgt", "14"], r"--tgt: 2 sequences for 1 sources"),
    ("tgt_fewer_than_src", W + ["--src-file", two, "--tgt-file", one_tgt], r"--tgt: 1 sequences for 2 sources"),
    ("tgt_id_out_of_range", W + ["--src", "3", "--tgt", "14 16"] + D, r"target sequence 1, token 2: id 16 is outside the vocabulary"),
    ("tgt_negative", W + ["--src", "3", "--tgt", "14 -3"] + D, r"target sequence 1, token 2: id -3 is outside"),
    ("tgt_empty", W + ["--src", "3", "--tgt", ""] + D, r"target sequence 1 is empty"),
    ("tgt_without_dump", W + ["--src", "3", "--tgt", "14 3"], r"--tgt: .*only written by --dump"),
    ("tgt_not_a_number", W + ["--src", "3", "--tgt", "14 three"], r"--tgt #1: 'three' is not a token id"),
    # other options
    ("repeat_zero", W + ["--src", "3", "--repeat", "0"], r"--repeat: Value 0 not in range"),
    ("unknown_option", W + ["--src", "3", "--bogus"], r"--bogus"),
    ("weights_missing_option", ["--src", "3"], r"--weights is required"),
    ("weights_nonexistent", ["--weights", path("nope.safetensors"), "--src", "3"], r"cannot open weights file: No such file"),
    ("weights_fifo", ["--weights", fifo, "--src", "3"], r"weights.fifo: not a regular file"),
    ("dump_into_missing_dir", W + ["--src", "3", "--dump", path("no/such/dir/out.safetensors")], r"cannot write"),
    # --dump never replaces one of the inputs
    ("dump_onto_weights", ["--weights", weights_copy, "--src", "3", "--dump", weights_copy], r"same file as the input"),
    ("dump_onto_src_file", W + ["--src-file", src_copy, "--dump", src_copy], r"same file as the input"),
]

# Documented decisions: these succeed.
CONTROLS = [
    ("src_file_blank_lines_and_crlf_skipped", W + ["--src-file", crlf], "9 1 7 3 15\n3 4 5 15\n"),
    ("comma_separators", W + ["--src", "3,7,1,9"], "9 1 7 3 15\n"),
    ("leading_zeros", W + ["--src", "03 007 1 9"], "9 1 7 3 15\n"),
    ("max_new_tokens_equals_max_len", W + ["--src", "3 7 1 9", "-n", "64"], "9 1 7 3 15\n"),
    ("max_new_tokens_one", W + ["--src", "3 7 1 9", "-n", "1"], "9\n"),
    ("longest_sequence", W + ["--src", " ".join(["5"] * 64), "-n", "2"], None),
]

failures = []
inputs_before = {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in (weights_copy, src_copy)}


def run(args):
    try:
        return subprocess.run([BIN] + args, capture_output=True, text=True, timeout=20, errors="replace")
    except subprocess.TimeoutExpired:
        return None


for name, args, regex in ERRORS:
    r = run(args)
    if r is None:
        failures.append(f"{name}: timed out (hang)")
        continue
    out = r.stdout + r.stderr
    problems = []
    if r.returncode == 0:
        problems.append("exit status 0")
    if r.returncode < 0 or r.returncode >= 128:
        problems.append(f"killed by a signal / crashed (status {r.returncode})")
    if not re.search(regex, out):
        problems.append(f"output does not match /{regex}/")
    if "Sanitizer" in out or "runtime error:" in out:
        problems.append("sanitizer report")
    status = "ok" if not problems else "FAIL: " + "; ".join(problems)
    print(f"[{status}] {name}: exit {r.returncode}: {out.strip().splitlines()[0] if out.strip() else ''}")
    if problems:
        failures.append(f"{name}: {'; '.join(problems)}\n    args: {args}\n    output: {out.strip()}")

for name, args, expected in CONTROLS:
    r = run(args)
    ok = r is not None and r.returncode == 0 and (expected is None or r.stdout == expected) and not r.stderr.strip()
    print(f"[{'ok' if ok else 'FAIL'}] control {name}")
    if not ok:
        failures.append(f"control {name}: " + ("timed out" if r is None else
                        f"exit {r.returncode}, stdout {r.stdout!r}, stderr {r.stderr.strip()!r}"))

for p, digest in inputs_before.items():
    if hashlib.sha256(open(p, "rb").read()).hexdigest() != digest:
        failures.append(f"{p} was modified by a run")

shutil.rmtree(tmp, ignore_errors=True)
print(f"{len(ERRORS)} bad inputs, {len(CONTROLS)} controls, {len(failures)} failures")
if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
