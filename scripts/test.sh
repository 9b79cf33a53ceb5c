#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine (apt packages, the python extras, a CPU
# torch), then runs pytest. Extra arguments go to pytest. Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

bash scripts/install-system-deps.sh

# CPU torch first, from the wheel on disk: asked for indirectly, pip would fetch a multi-GB CUDA build.
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
    "$PY" -m pip install -q torch==2.13.0
fi
"$PY" -m pip install -q -e '.[test,train,host]' torch==2.13.0
# CUDA builds of these break `import transformers` next to a CPU torch; speculators never uses them.
if "$PY" -m pip show -q torchvision >/dev/null 2>&1 || "$PY" -m pip show -q torchaudio >/dev/null 2>&1; then
    "$PY" -m pip uninstall -q -y torchvision torchaudio
fi

# The demo's tiny verifier, built once into the user cache (about a minute of CPU on first use): the demo
# tests start the stand-in against that cache and would otherwise spend their ready timeout building it.
"$PY" -c 'from sim import tinylm; tinylm.ensure_model()'

exec "$PY" -m pytest "$@"
