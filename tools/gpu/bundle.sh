#!/usr/bin/env bash
# Collects what the CUDA tests and the GPU benchmark need into one small folder, to be
# carried to a machine with an NVIDIA GPU (the `device` tool of this workplace, or any
# box with a CUDA driver): nothing there is rebuilt, and the 356 MB transformer-base
# weights are made there (bench/halbench/gpu.py).
#   tools/gpu/bundle.sh [OUT=gpu-bundle]        (after tools/test.sh or the cuda fixtures)
# Then, on the GPU machine, from the repository root: bash tools/gpu/run.sh OUT RESULTS
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
source tools/env.sh
out="${1:-gpu-bundle}"
rm -rf "$out"; mkdir -p "$out/bin" "$out/models"
b=build
for t in test_layers_cuda test_model; do
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
# transformer-base for CUDA (cuda_capability from HALFORMER_GPU_SM, default 90 = H100)
# and the C++ benchmark driver linked against its library.
sm="${HALFORMER_GPU_SM:-90}"
spec="$out/transformer-base-cuda.yaml"
sed -e "s/^targets: \[host\]/targets: [host, cuda]\ncuda_capability: $sm/" models/transformer-base.yaml > "$spec"
grep -q "^cuda_capability: $sm" "$spec" || { echo "bundle: could not add the cuda target to $spec" >&2; exit 1; }
build/bin/halformer build "$spec" -o "$b/gpu/transformer-base"
cp "$b/gpu/transformer-base/transformer-base" "$out/bin/"
c++ -O2 -std=c++17 bench/cpp/model_bench.cpp -I runtime/include -include "$b/gpu/transformer-base/transformer-base.h" \
    -DHALFORMER_MODEL=halformer_model_transformer_base "$b/gpu/transformer-base/libtransformer-base.a" \
    -lpthread -ldl -o "$out/bin/halformer_model_bench"
# Shared libraries the binaries need that a CUDA image may lack (Debian's utf8proc for
# the tokenizer); run.sh puts $out/lib on LD_LIBRARY_PATH.
mkdir -p "$out/lib"
for lib in $(ldd "$out/bin/transformer-base" "$out/bin/test_model" | awk '/=> \// {print $3}' | sort -u); do
  case "$(basename "$lib")" in libc.so*|libm.so*|libstdc++*|libgcc_s*|libpthread*|libdl.so*|librt.so*) ;;
    *) cp -L "$lib" "$out/lib/" ;; esac
done
du -sh "$out"
