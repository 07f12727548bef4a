#!/usr/bin/env bash
# Collects what the CUDA tests and the GPU benchmark need into one small folder, to be
# carried to a machine with an NVIDIA GPU (the `device` tool of this workplace, or any
# box with a CUDA driver): nothing there is rebuilt, and the 356 MB transformer-base
# weights are made there (bench/halbench/gpu.py).
#   tools/gpu/bundle.sh [OUT=gpu-bundle]        (after tools/test.sh or the cuda fixtures)
# Then, on the GPU machine, from the repository root: bash tools/gpu/run.sh OUT RESULTS
# The tuner (halformer-tune, for run.sh --tune) needs libHalide.so there too: with
# HALFORMER_GPU_TUNER=1 it goes into OUT/lib as libHalide.so.xz (165 MB -> 46 MB, 1 min).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
source tools/env.sh
out="${1:-gpu-bundle}"
rm -rf "$out"; mkdir -p "$out/bin" "$out/models"
b=build
for t in layers/test_layers_cuda models/test_model; do
  [ -x "$b/tests/$t" ] || { echo "bundle: $b/tests/$t is missing (build first)" >&2; exit 1; }
  cp "$b/tests/$t" "$out/bin/"
done
# The golden models with a CUDA build, with the PyTorch reference made on this machine.
for m in gpu-small gpt-awkward bert-embed-awkward; do
  d="$b/models/$m"
  build/bin/halformer build "tests/models/$m.yaml" -o "$d" > /dev/null  # relinks after runtime changes
  [ -x "$d/$m" ] && [ -f "$d/reference/reference.safetensors" ] || {
    echo "bundle: $d is not built or has no reference (ctest -R '$m')" >&2; exit 1; }
  mkdir -p "$out/models/$m/reference"
  cp "$d/$m" "$out/models/$m/"
  cp "$d/reference/reference.safetensors" "$d/reference/weights.safetensors" "$out/models/$m/reference/"
done
# gpu-small's bf16 build (checked against the fp32 reference above, tolerance 0.01).
d="$b/models/gpu-small-bf16"
build/bin/halformer build tests/models/gpu-small.yaml --precision bf16 -o "$d" > /dev/null
mkdir -p "$out/models/gpu-small-bf16"
cp "$d/gpu-small" "$out/models/gpu-small-bf16/"
# transformer-base for CUDA (cuda_capability from HALFORMER_GPU_SM, default 90 = H100)
# and the C++ benchmark driver linked against its library.
sm="${HALFORMER_GPU_SM:-90}"
spec="$out/transformer-base-cuda.yaml"
sed -e "s/^targets: \[host\]/targets: [host, cuda]\ncuda_capability: $sm/" models/transformer-base.yaml > "$spec"
grep -q "^cuda_capability: $sm" "$spec" || { echo "bundle: could not add the cuda target to $spec" >&2; exit 1; }
build/bin/halformer build "$spec" -o "$b/gpu/transformer-base"
cp "$b/gpu/transformer-base/transformer-base" "$out/bin/"
model_bench() {  # model_bench BUILD_DIR OUT_BIN [MODEL=transformer-base]: the driver linked against a build
  local m="${3:-transformer-base}"
  c++ -O2 -std=c++17 bench/cpp/model_bench.cpp -I runtime/include -include "$1/$m.h" \
      -DHALFORMER_MODEL="halformer_model_${m//-/_}" "$1/lib$m.a" -lpthread -ldl -o "$2"
}
model_bench "$b/gpu/transformer-base" "$out/bin/halformer_model_bench"
# The same model in bf16 (tensor cores through cuBLASLt for many rows, Halide kernels
# reading bf16 weights for few) and in fp32 with TF32 allowed (spec `tf32: true`).
build/bin/halformer build "$spec" --precision bf16 -o "$b/gpu/transformer-base-bf16"
model_bench "$b/gpu/transformer-base-bf16" "$out/bin/halformer_model_bench_bf16"
{ cat "$spec"; echo "tf32: true"; } > "$out/transformer-base-cuda-tf32.yaml"
build/bin/halformer build "$out/transformer-base-cuda-tf32.yaml" -o "$b/gpu/transformer-base-tf32"
model_bench "$b/gpu/transformer-base-tf32" "$out/bin/halformer_model_bench_tf32"
# A TinyLlama-1.1B-shaped decoder (bf16, random weights made on the GPU machine).
build/bin/halformer build bench/gpu/tinyllama-1b.yaml -o "$b/gpu/tinyllama-1b"
model_bench "$b/gpu/tinyllama-1b" "$out/bin/tinyllama_model_bench" tinyllama-1b
# Schedule variants timed side by side by run.sh (HALFORMER_GPU_VARIANTS="NAME=KNOB:VALUE[,KNOB:VALUE] ...",
# knobs as the spec's `schedule:` keys, e.g. ks512=linear.gpu_k_slice:512).
for v in ${HALFORMER_GPU_VARIANTS:-}; do
  name="${v%%=*}"; knobs="${v#*=}"
  vspec="$out/transformer-base-cuda-$name.yaml"
  { cat "$spec"; echo "schedule:"; tr ',' '\n' <<< "$knobs" | sed -e 's/^/  /' -e 's/:/: /'; } > "$vspec"
  build/bin/halformer build "$vspec" -o "$b/gpu/transformer-base-$name"
  model_bench "$b/gpu/transformer-base-$name" "$out/bin/halformer_model_bench_$name"
done
# Shared libraries the binaries need that a CUDA image may lack (Debian's utf8proc for
# the tokenizer); run.sh puts $out/lib on LD_LIBRARY_PATH.
mkdir -p "$out/lib"
cp build/bin/halformer-tune "$out/bin/"
cp build/bin/halformer "$out/bin/"  # the PyTorch reference reads spec defaults through it (HALFORMER_CLI)
for lib in $(ldd "$out/bin/transformer-base" "$out/bin/test_model" "$out/bin/halformer-tune" "$out/bin/halformer" | awk '/=> \// {print $3}' | sort -u); do
  case "$(basename "$lib")" in libc.so*|libm.so*|libstdc++*|libgcc_s*|libpthread*|libdl.so*|librt.so*) ;;
    libHalide.so) [ "${HALFORMER_GPU_TUNER:-0}" = 1 ] && xz -T0 -6 -c "$lib" > "$out/lib/libHalide.so.xz" ;;
    *) cp -L "$lib" "$out/lib/" ;; esac
done
du -sh "$out"
