#!/usr/bin/env bash
# Every kernel of a model built with `targets: [.., cuda]` must carry PTX for the spec's
# compute capability, with at least one kernel entry: a schedule that silently fell
# back to the host would produce an object without any.
#   check_ptx.sh MODEL_BUILD_DIR SM   (e.g. build/models/gpu-small/.halformer/build 80)
#   check_ptx.sh --libs SM LIB.a...   (kernels compiled for CUDA one by one)
set -euo pipefail
if [ "$1" = "--libs" ]; then
  sm="$2"; shift 2; libs=("$@")
else
  dir="$1"; sm="$2"
  plan=$(ls "$dir"/*.plan/plan.cmake)
  libs=()
  for k in $(sed -n 's/^set(HALFORMER_PLAN_KERNELS \(.*\))$/\1/p' "$plan"); do libs+=("$dir/lib${k}_cuda.a"); done
fi
n=0; bad=0
for lib in "${libs[@]}"; do
  k=$(basename "$lib" .a); k=${k#lib}; k=${k%_cuda}
  if [ ! -f "$lib" ]; then echo "MISSING $lib"; bad=1; continue; fi
  text=$(strings -a "$lib")
  entries=$(grep -c "^\.visible \.entry\|\.entry " <<<"$text" || true)
  if ! grep -q "\.target sm_${sm}" <<<"$text" || [ "$entries" -lt 1 ]; then
    echo "NO PTX for sm_${sm} in $k (entries: $entries)"; bad=1
  else
    echo "ok $k: .target sm_${sm}, $entries kernel entries"
  fi
  n=$((n + 1))
done
echo "checked $n kernels"
[ "$n" -gt 0 ] && [ "$bad" = 0 ]
