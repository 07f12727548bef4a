#!/usr/bin/env bash
# The whole test suite: configure, build, ctest (the last lines are ctest's summary).
# Needs tools/bootstrap.sh to have run once.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source tools/env.sh
exec cmake --workflow --preset default
