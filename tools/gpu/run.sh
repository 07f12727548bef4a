#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: every CUDA test of the bundle made by
# tools/gpu/bundle.sh, then the benchmark against PyTorch on the same GPU.
#   bash tools/gpu/run.sh BUNDLE RESULTS [--quick] [--tests-only|--bench-only]
# Needs python3 with torch (CUDA), numpy, pyyaml and safetensors; nothing is built here.
# The summary table is printed last; logs and JSON go to RESULTS.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bundle="$(cd "$1" && pwd)"; results="$2"; shift 2
quick=""; tests=1; bench=1
for a in "$@"; do
  case "$a" in --quick) quick=--quick ;; --tests-only) bench=0 ;; --bench-only) tests=0 ;; esac
done
mkdir -p "$results"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$results/gpu.txt"
fails=0
step() {  # step NAME CMD...: runs it, logs it, counts a failure
  local name="$1"; shift
  local t0=$SECONDS
  if "$@" > "$results/$name.log" 2>&1; then echo "PASS $name ($((SECONDS - t0)) s)"
  else echo "FAIL $name ($((SECONDS - t0)) s)"; tail -25 "$results/$name.log"; fails=$((fails + 1)); fi
}
if [ "$tests" = 1 ]; then
  step layers_cuda "$bundle/bin/test_layers_cuda"
  for m in gpu-small gpt-awkward bert-embed-awkward; do
    d="$bundle/models/$m"
    step "model_vs_torch_${m}_cuda" env HALFORMER_MODEL_BIN="$d/$m" HALFORMER_REFERENCE_DIR="$d/reference" \
      HALFORMER_WEIGHTS="$d/reference/weights.safetensors" HALFORMER_DEVICE=cuda "$bundle/bin/test_model"
  done
  d="$bundle/models/gpu-small"
  step residency_gpu-small_cuda python3 "$root/tests/check_residency.py" "$d/gpu-small" "$d/reference/weights.safetensors" cuda
  step batching_gpu-small_cuda env HALFORMER_DEVICE=cuda python3 "$root/tests/check_batching.py" "$d/gpu-small" \
    "$d/reference/weights.safetensors" "5 9 13 2 30" "8" "30 31 32 33 34 35 1 2 3 4 5 6" "7 7 7"
  grep -h "max abs\|error\|FAILED\|PASSED" "$results"/model_vs_torch_*_cuda.log | head -40 > "$results/model_errors.txt" || true
fi
if [ "$bench" = 1 ]; then
  (cd "$root/bench" && PYTHONUNBUFFERED=1 python3 -m halbench.gpu --spec "$bundle/transformer-base-cuda.yaml" \
     --model-bench "$bundle/bin/halformer_model_bench" --out "$results/bench" $quick) 2>&1 | tee "$results/bench.log" | tail -20
fi
echo "failures: $fails"
[ "$fails" = 0 ]
