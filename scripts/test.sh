#!/usr/bin/env bash
# Run the test suite (sets the environment up first when needed; idempotent).
#   bash scripts/test.sh [pytest args]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPARSECLIP_VENV:-$REPO/.venv}"
bash "$REPO/scripts/setup.sh"
cd "$REPO"
exec "$VENV/bin/python" -m pytest -q "$@" tests
