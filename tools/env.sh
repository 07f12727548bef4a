# Source this to put halformer's pinned toolchain (.venv: cmake, ninja, python) on PATH
# and to tell CMake where the pinned Halide lives.
_hf_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$_hf_root/.venv/bin:$PATH"
unset _hf_root
