#!/bin/sh
# Builds a libFuzzer harness from fuzz/ with clang++ (whatever compiler the project uses)
# and runs it for a bounded time over the committed seed corpus.
#   usage: run_fuzzer.sh SOURCE_DIR WORK_DIR HARNESS SECONDS
# HARNESS: spec_parser | safetensors | gguf. Exit 77 (ctest: skipped) when clang++ or its
# libFuzzer runtime is missing. New corpus entries go to WORK_DIR/<harness>-corpus (the
# committed seeds are only read); a crash leaves its input in WORK_DIR/<harness>-artifacts/
# -- copy it to fuzz/regressions/<harness>/ (replayed by the unit tests) and fix the bug.
set -eu
src=$1 work=$2 harness=$3 secs=$4
CLANGXX=${CLANGXX:-clang++}
if ! command -v "$CLANGXX" >/dev/null 2>&1; then
  echo "$CLANGXX not found: fuzzing skipped"
  exit 77
fi
cd "$src"
case $harness in
  spec_parser)
    sources="fuzz/spec_parser_fuzzer.cpp $(echo tools/spec/*.cpp)"  # the whole halformer_spec library
    deps="$sources $(echo tools/spec/*.h)"
    flags="-I tools/spec -I runtime/include" libs="-lyaml-cpp"
    # models/ also holds weights: seed with its specs only.
    mkdir -p "$work/spec_parser-seeds-models"
    cp models/*.yaml "$work/spec_parser-seeds-models/"
    seeds="fuzz/corpus/spec_parser $work/spec_parser-seeds-models tests/tools/spec/good tests/tools/spec/broken"
    max_len=8192 ;;
  safetensors)
    sources="fuzz/safetensors_fuzzer.cpp runtime/safetensors.cpp"
    deps="$sources runtime/include/halformer/safetensors.h runtime/include/halformer/error.h fuzz/fuzz_input_file.h"
    flags="-I runtime/include" libs=""
    seeds="fuzz/corpus/safetensors"
    max_len=4096 ;;
  gguf)
    sources="fuzz/gguf_fuzzer.cpp tools/import/gguf_file.cpp"
    deps="$sources tools/import/gguf_file.h fuzz/fuzz_input_file.h"
    flags="-I tools/import" libs=""
    seeds="fuzz/corpus/gguf"
    max_len=4096 ;;
  *) echo "unknown harness $harness"; exit 2 ;;
esac
mkdir -p "$work"
bin="$work/fuzz_$harness"
stale=no
if [ ! -x "$bin" ]; then stale=yes; else
  for f in $deps; do [ "$f" -nt "$bin" ] && stale=yes; done
fi
if [ $stale = yes ]; then
  t0=$(date +%s)
  # shellcheck disable=SC2086
  if ! "$CLANGXX" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
      -fno-omit-frame-pointer $flags $sources $libs -o "$bin.tmp" 2> "$work/$harness-build.log"; then
    if grep -q "libclang_rt.fuzzer\|fuzzer-no-link\|unsupported option '-fsanitize=fuzzer" "$work/$harness-build.log"; then
      cat "$work/$harness-build.log"; echo "no libFuzzer runtime: fuzzing skipped"; exit 77
    fi
    cat "$work/$harness-build.log"; exit 1
  fi
  mv "$bin.tmp" "$bin"
  echo "built $bin in $(( $(date +%s) - t0 )) s"
fi
corpus="$work/$harness-corpus" artifacts="$work/$harness-artifacts"
mkdir -p "$corpus" "$artifacts" "$artifacts.old"
# Inputs found by an earlier run were reported then; keep them aside.
find "$artifacts" -type f -exec mv {} "$artifacts.old/" \;
existing=""
for d in $seeds; do [ -d "$d" ] && existing="$existing $d"; done
set +e
# shellcheck disable=SC2086
"$bin" -dict="fuzz/${harness%_parser}.dict" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
  -max_len=$max_len -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" $existing \
  > "$work/$harness.log" 2>&1
rc=$?
set -e
sed -e '/^###### Recommended dictionary/,/^###### End of recommended dictionary/d' \
    -e '/^#[0-9]*	\(NEW\|REDUCE\|pulse\)/d' -e '/^	NEW_FUNC/d' "$work/$harness.log"
if [ $rc -ne 0 ] || [ -n "$(ls -A "$artifacts")" ]; then
  echo "FAILED (libFuzzer exit $rc); inputs in $artifacts:"; ls -l "$artifacts"
  exit 1
fi
