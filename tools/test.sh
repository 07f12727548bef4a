#!/usr/bin/env bash
# The README's test command: install what is missing (tools/bootstrap.sh, test dependencies
# included; seconds when all is there), then configure, build and ctest the whole
# project in build/ (the last lines are ctest's summary).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash tools/bootstrap.sh
source tools/env.sh
exec cmake --workflow --preset default
