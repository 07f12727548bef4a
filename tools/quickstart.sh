#!/usr/bin/env bash
# Quick start: install only what the main job needs (tools/bootstrap.sh --core: compiler,
# Halide, yaml-cpp and friends; no test dependencies), build only what `halformer build`
# uses (the CLI, the generators, the runtime: CMakePresets.json's core presets), build the
# bundled default model (models/reverse-tiny.yaml) and run it on the bundled weights: it
# reverses "3 7 1 9". tools/test.sh later installs the rest and builds everything in the
# same build/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash tools/bootstrap.sh --core
source tools/env.sh
echo "[quickstart] building halformer (CLI, generators, runtime)"
cmake --preset core > build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
rm -f build-configure.log
cmake --build --preset core
echo "[quickstart] building the model from models/reverse-tiny.yaml"
build/bin/halformer build models/reverse-tiny.yaml -o out/reverse-tiny
echo "[quickstart] out/reverse-tiny/reverse-tiny --weights models/reverse-tiny.safetensors --src \"3 7 1 9\""
out/reverse-tiny/reverse-tiny --weights models/reverse-tiny.safetensors --src "3 7 1 9"
echo "[quickstart] (15 is the end-of-sequence token)"
