#!/usr/bin/env bash
# Set up littlelm in ./.venv: Python venv, PyTorch, littlelm (editable) with test tools.
# Idempotent: a second run only checks. Override the interpreter with PYTHON=..., the torch
# requirement with TORCH_SPEC=... (e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu128").
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "littlelm needs Python >= 3.10 (found $("$PY" --version))" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    # shellcheck disable=SC2086
    .venv/bin/python -m pip install -q ${TORCH_SPEC:-torch==2.13.0}
fi
.venv/bin/python -m pip install -q -e ".[dev]"
echo "littlelm ready: .venv/bin/littlelm (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
