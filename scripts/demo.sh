#!/usr/bin/env bash
# Fresh machine -> the console running on the built-in SIMULATED demo host. Extra arguments go to
# eagle3-console (e.g. --demo-speed 4 or --readonly).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v tmux >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tmux >/dev/null
    else echo "tmux is needed for the demo host: sudo apt-get install tmux" >&2; exit 1; fi
fi
# the console, plus what the stage programs need on the (here: local) GPU host
"$PY" -m pip install -q -e '.[host]'
exec "$PY" -m console.cli --demo "$@"
