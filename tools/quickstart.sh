#!/usr/bin/env bash
# Quick start: install what is missing, build halformer, build the bundled default model
# (models/reverse-tiny.yaml) and run it on the bundled weights: it reverses "3 7 1 9".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash tools/bootstrap.sh
source tools/env.sh
echo "[quickstart] building halformer (generators, runtime, CLI)"
cmake --preset default > build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
rm -f build-configure.log
cmake --build --preset default
echo "[quickstart] building the model from models/reverse-tiny.yaml"
build/bin/halformer build models/reverse-tiny.yaml -o out/reverse-tiny
echo "[quickstart] out/reverse-tiny/reverse-tiny --weights models/reverse-tiny.safetensors --src \"3 7 1 9\""
out/reverse-tiny/reverse-tiny --weights models/reverse-tiny.safetensors --src "3 7 1 9"
echo "[quickstart] (15 is the end-of-sequence token)"
