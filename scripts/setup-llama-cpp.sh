#!/usr/bin/env bash
# Build llama-cpp-python (llama.cpp itself) into ./.venv from its sdist, so the tests that load
# littlelm's GGUF exports in llama.cpp run (tests/test_interop.py). Optional for users; CI runs
# it. PyPI has only the sdist: this compiles llama.cpp for this CPU, ~5 min on 2 cores.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC="${LLAMA_CPP_SPEC:-llama-cpp-python==0.3.36}"
[ -x .venv/bin/python ] || { echo "run ./scripts/setup.sh first" >&2; exit 1; }
if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    # the library only: the examples, tools, tests and multimodal parts are not needed (and
    # take most of the compile time)
    CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF}" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        .venv/bin/python -m pip install -q --no-binary llama-cpp-python "$SPEC"
fi
echo "llama.cpp ready: llama-cpp-python $(.venv/bin/python -c 'import llama_cpp; print(llama_cpp.__version__)')"
