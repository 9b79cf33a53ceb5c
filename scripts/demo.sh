#!/usr/bin/env bash
# Fresh machine -> the console running on the built-in SIMULATED demo host. Extra arguments go to
# eagle3-console (e.g. --demo-speed 4 or --readonly).
#
# Installs what the demo's whole pipeline needs (generate .. verify, serve-drafter, bench): a CPU torch,
# the `train` extra (speculators, transformers) and the `host` extra, then builds the stand-in's tiny
# verifier once. First start on a fresh machine: a few minutes (downloads, then about a minute of CPU
# for the tiny model); later starts: seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v tmux >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tmux >/dev/null
    else echo "tmux is needed for the demo host: sudo apt-get install tmux" >&2; exit 1; fi
fi
# CPU torch first, as scripts/test.sh does: asked for indirectly, pip would fetch a multi-GB CUDA build.
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
    echo "demo: installing a CPU torch (first start only)" >&2
    "$PY" -m pip install -q torch==2.13.0
fi
# the console, the training stack the drafter stages run, and what the stage programs need on the host
echo "demo: installing the console with the train and host extras" >&2
"$PY" -m pip install -q -e '.[train,host]' torch==2.13.0
# The stand-in's tiny verifier, built once into the user cache with progress on the terminal (about a
# minute of CPU on first start); the console would otherwise wait silently for the stand-in to build it.
"$PY" -m sim.tinylm
exec "$PY" -m console.cli --demo "$@"
