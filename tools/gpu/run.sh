#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: every CUDA test of the bundle made by
# tools/gpu/bundle.sh, then the benchmark against PyTorch on the same GPU.
#   bash tools/gpu/run.sh BUNDLE RESULTS [--quick] [--tests-only|--bench-only] [--tune SECONDS] [--ncu]
# Needs python3 with torch (CUDA), numpy, pyyaml and safetensors; nothing is built here.
# --tune: afterwards `halformer tune --target cuda` on transformer-base for SECONDS (the
# bundle made with HALFORMER_GPU_TUNER=1); its database lands in RESULTS/tuning-cuda.db
# (one already there is extended); HALFORMER_TUNE_KERNEL limits it to matching kernels.
# --ncu: after the bench, Nsight Compute on the first four many-row matmul launches of a
# batch-32 encoder call (layer 0's QKV, output, feed-forward projections), into
# RESULTS/ncu_linear_b32.log (CSV after the benchmark driver's JSON line).
# The summary table is printed last; logs and JSON go to RESULTS.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bundle="$(cd "$1" && pwd)"; results="$2"; shift 2
quick=""; tests=1; bench=1; tune=0; ncu=0
while [ $# -gt 0 ]; do
  case "$1" in --quick) quick=--quick ;; --tests-only) bench=0 ;; --bench-only) tests=0 ;; --ncu) ncu=1 ;;
    --tune) tune="$2"; shift ;; *) echo "run.sh: unknown option $1" >&2; exit 2 ;; esac
  shift
done
mkdir -p "$results"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HALFORMER_CLI="$bundle/bin/halformer"  # spec defaults for the PyTorch reference (halformer_torch)
# Halide's CUDA runtime dlopens "libcuda.so"; driver installs in containers often carry
# only libcuda.so.1.
if ! ldconfig -p | grep -q 'libcuda\.so '; then
  c="$(ldconfig -p | awk '/libcuda\.so\.1 / {print $NF; exit}')"
  [ -n "$c" ] || c="$(ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>/dev/null | head -1)"
  if [ -n "$c" ]; then ln -sf "$c" "$bundle/lib/libcuda.so"; echo "libcuda.so -> $c"; fi
fi
# cuBLASLt (the runtime opens it: runtime/gpu_blas.h): the copy PyTorch's CUDA wheels ship.
if [ -z "${HALFORMER_CUBLASLT:-}" ]; then
  HALFORMER_CUBLASLT="$(python3 -c '
import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages(), "/usr/local/cuda/lib64"]
hits = [p for d in dirs for p in glob.glob(os.path.join(d, "**", "libcublasLt.so.1[0-9]*"), recursive=True)]
print(sorted(hits, key=len)[0] if hits else "")' 2>/dev/null)"
fi
export HALFORMER_CUBLASLT
echo "cuBLASLt: ${HALFORMER_CUBLASLT:-not found}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$results/gpu.txt"
fails=0
step() {  # step NAME CMD...: runs it, logs it, counts a failure
  local name="$1"; shift
  local t0=$SECONDS
  # On the GPU machine a skip ("CUDA is not usable here") is a failure too.
  if "$@" > "$results/$name.log" 2>&1 && ! grep -q "is not usable here" "$results/$name.log"; then
    echo "PASS $name ($((SECONDS - t0)) s)"
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
  step model_vs_torch_gpu-small_bf16_cuda env HALFORMER_MODEL_BIN="$bundle/models/gpu-small-bf16/gpu-small" \
    HALFORMER_REFERENCE_DIR="$d/reference" HALFORMER_WEIGHTS="$d/reference/weights.safetensors" HALFORMER_DEVICE=cuda \
    HALFORMER_RUN_TAG=bf16-cuda HALFORMER_TOLERANCE=0.01 "$bundle/bin/test_model"
  # Every linear through cuBLASLt (HALFORMER_GPU_GEMM=cublaslt; by default only those of more
  # than 256 rows, which these small inputs never reach): fp32 at the fp32 tolerance, bf16
  # tensor cores against the fp32 reference, the awkward shapes (N not a multiple of 64).
  for m in gpu-small gpt-awkward bert-embed-awkward; do
    d="$bundle/models/$m"
    step "model_vs_torch_${m}_cublaslt_cuda" env HALFORMER_GPU_GEMM=cublaslt HALFORMER_MODEL_BIN="$d/$m" \
      HALFORMER_REFERENCE_DIR="$d/reference" HALFORMER_WEIGHTS="$d/reference/weights.safetensors" \
      HALFORMER_DEVICE=cuda HALFORMER_RUN_TAG=cublaslt-cuda "$bundle/bin/test_model"
  done
  d="$bundle/models/gpu-small"
  step model_vs_torch_gpu-small_bf16_cublaslt_cuda env HALFORMER_GPU_GEMM=cublaslt \
    HALFORMER_MODEL_BIN="$bundle/models/gpu-small-bf16/gpu-small" HALFORMER_REFERENCE_DIR="$d/reference" \
    HALFORMER_WEIGHTS="$d/reference/weights.safetensors" HALFORMER_DEVICE=cuda HALFORMER_RUN_TAG=bf16-cublaslt-cuda \
    HALFORMER_TOLERANCE=0.01 "$bundle/bin/test_model"
  step residency_gpu-small_cuda python3 "$root/tests/models/check_residency.py" "$d/gpu-small" "$d/reference/weights.safetensors" cuda
  step batching_gpu-small_cuda env HALFORMER_DEVICE=cuda python3 "$root/tests/models/check_batching.py" "$d/gpu-small" \
    "$d/reference/weights.safetensors" "5 9 13 2 30" "8" "30 31 32 33 34 35 1 2 3 4 5 6" "7 7 7"
  grep -h "max abs\|error\|FAILED\|PASSED" "$results"/model_vs_torch_*_cuda.log | head -40 > "$results/model_errors.txt" || true
fi
if [ "$bench" = 1 ]; then
  # The build with the spec's own schedules, and any variants bundle.sh made, side by side.
  builds=(--model-bench "halformer=$bundle/bin/halformer_model_bench")
  for v in "$bundle"/bin/halformer_model_bench_*; do
    [ -x "$v" ] && builds+=(--model-bench "${v##*/halformer_model_bench_}=$v")
  done
  # The fp32 and bf16 builds again with every linear a Halide kernel: cuBLASLt's share.
  builds+=(--model-bench "fp32-halide=$bundle/bin/halformer_model_bench@HALFORMER_GPU_GEMM=halide")
  [ -x "$bundle/bin/halformer_model_bench_bf16" ] &&
    builds+=(--model-bench "bf16-halide=$bundle/bin/halformer_model_bench_bf16@HALFORMER_GPU_GEMM=halide")
  # The TinyLlama-shaped decoder (bundle.sh builds it): decode and prefill against PyTorch bf16.
  dec=()
  [ -x "$bundle/bin/tinyllama_model_bench" ] && dec=(--decoder-spec "$root/bench/gpu/tinyllama-1b.yaml"
                                                     --decoder-bench "bf16=$bundle/bin/tinyllama_model_bench"
                                                     --decoder-bench "bf16-cublaslt=$bundle/bin/tinyllama_model_bench@HALFORMER_GPU_GEMM=cublaslt")
  (cd "$root/bench" && PYTHONUNBUFFERED=1 python3 -m halbench.gpu --spec "$bundle/transformer-base-cuda.yaml" \
     "${builds[@]}" "${dec[@]}" --keep-weights --out "$results/bench" $quick) 2>&1 | tee "$results/bench.log" | tail -70
  # The decoder's kernels one by one (decode of 64 steps, a prefill of 2048), then its 2 GB weights go.
  w="$results/bench/tinyllama-1b.safetensors"
  if [ -f "$w" ]; then
    profile_decoder() {  # profile_decoder NAME ARGS...
      local name="$1"; shift
      HALFORMER_PROFILE=1 "$bundle/bin/tinyllama_model_bench" --device cuda --weights "$w" --skip-encoder \
        --src-file "$results/bench/tinyllama-1b_prompt.txt" --warmup 1 --repeat 1 --new-tokens 64 "$@" \
        > /dev/null 2> "$results/profile_tinyllama_$name.txt"
    }
    profile_decoder decode
    profile_decoder prefill --skip-decode --prefill-len 2048 --prefill-repeat 1
    rm -f "$w"
  fi
  # Per-kernel device times (HALFORMER_PROFILE synchronises around every kernel): the
  # encoder at batch 8 and 32 and greedy decode at batch 1, on the bench's weights.
  for run in "encoder_b8 8 --skip-decode" "encoder_b32 32 --skip-decode" "decode_b1 1 --skip-encoder"; do
    set -- $run
    [ -f "$results/bench/src_b$2.txt" ] && HALFORMER_PROFILE=1 "$bundle/bin/halformer_model_bench" --device cuda \
      --weights "$results/bench/weights.safetensors" --src-file "$results/bench/src_b$2.txt" --threads 4 \
      --warmup 1 --repeat 3 --new-tokens 64 "$3" > /dev/null 2> "$results/profile_$1.txt"
  done
  ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
  if [ "$ncu" = 1 ] && [ -f "$results/bench/src_b32.txt" ] && [ -n "$ncu_bin" ]; then
    step ncu_linear_b32 "$ncu_bin" --csv -k regex:block_id_y__1 --launch-count 4 --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
      "$bundle/bin/halformer_model_bench" --device cuda --weights "$results/bench/weights.safetensors" \
      --src-file "$results/bench/src_b32.txt" --threads 4 --warmup 0 --repeat 1 --skip-decode
  fi
fi
if [ "$tune" != 0 ]; then
  [ -f "$bundle/lib/libHalide.so" ] || xz -dc "$bundle/lib/libHalide.so.xz" > "$bundle/lib/libHalide.so"
  step tune_cuda timeout $((tune + 60)) "$bundle/bin/halformer-tune" "$bundle/transformer-base-cuda.yaml" --target cuda \
    --seq-lens 128 --batch-sizes 1 8 32 --budget "${tune}s" --no-autoschedulers --db "$results/tuning-cuda.db" \
    ${HALFORMER_TUNE_KERNEL:+--kernel "$HALFORMER_TUNE_KERNEL"}
  tail -30 "$results/tune_cuda.log"
fi
echo "failures: $fails"
[ "$fails" = 0 ]
