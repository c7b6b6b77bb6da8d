#!/usr/bin/env bash
# Run the test suite (sets the environment up first when needed; idempotent).
#   bash scripts/test.sh [pytest args]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPARSECLIP_VENV:-$REPO/.venv}"
bash "$REPO/scripts/setup.sh"
cd "$REPO"
# Two worker processes (pytest-xdist), each test file on one worker so that a file's
# module fixtures are built once; SPARSECLIP_TEST_WORKERS=0 runs the suite in this process.
WORKERS="${SPARSECLIP_TEST_WORKERS:-2}"
if [ "$WORKERS" = "0" ]; then
    exec "$VENV/bin/python" -m pytest -q "$@" tests
fi
exec "$VENV/bin/python" -m pytest -q -n "$WORKERS" --dist loadfile "$@" tests
