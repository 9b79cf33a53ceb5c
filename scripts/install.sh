#!/usr/bin/env bash
# The one install step of scripts/demo.sh and scripts/test.sh: a project-local venv with the console.
#
#   scripts/install.sh [full|fast]      (or, sourced: e3_install full|fast [now|background LOG], which
#                                        sets E3_PY)
#
# full: a CPU torch, then the console with the test, train and host extras, then the stand-in's tiny
#       verifier built once into ~/.cache/eagle3-console (what the demo's pipeline and the whole suite need);
#       `background LOG` starts that build as soon as the packages are in, beside the import check, with its
#       output in LOG and its pid in E3_MODEL_PID (scripts/test.sh: it runs on through pytest's first minutes).
# fast: the console with the test extra only (scripts/test.sh --fast: no torch, no tiny model).
#
# The venv is $E3_VENV, default .venv in the checkout; it is made with $PYTHON (default python3), never
# with --system-site-packages, so nothing of the caller's python leaks in. A second run checks what is
# there and installs nothing when the venv was already installed from this pyproject.toml and this
# script (a stamp file in the venv) and still imports: seconds, no pip.

_E3_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

_e3_die() {
    echo "install: $*" >&2
    return 1
}

# What each mode must import afterwards; a broken stack fails here with the reason, not in a stage later.
# Run isolated (-I: no current dir, no PYTHONPATH), so the checkout's files never stand in for the install;
# argv[1] is the checkout the editable install must point at.
_E3_CHECK_FAST='import os, sys
import console.cli, pytest, pytest_asyncio, pytest_timeout
if not os.path.realpath(console.cli.__file__).startswith(os.path.realpath(sys.argv[1]) + os.sep):
    sys.exit(f"the console in this venv is {console.cli.__file__}, not the one in {sys.argv[1]}")'
_E3_CHECK_FULL="$_E3_CHECK_FAST"'
import torch
if not torch.__version__.startswith("2.13.0"):
    sys.exit(f"torch {torch.__version__} is installed, 2.13.0 (the CPU build) was expected")
import transformers
from transformers import LlamaConfig
import speculators, datasets, orjson'

_e3_stamp() {
    # what decides the install: the mode, the dependencies and extras of pyproject.toml (not its other
    # tables: a new pytest marker reinstalls nothing) and this script's steps. $2: the venv's python.
    { echo "$1"
      "$2" -I -c 'import json, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(json.dumps([project.get("dependencies"), project.get("optional-dependencies")], sort_keys=True))' \
          "$_E3_ROOT/pyproject.toml"
      cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -d' ' -f1
}

# The tiny verifier's build in the background (e3_install's `background LOG`): one core for a minute and a
# half on a fresh machine, started as soon as its packages are in.
_e3_build_model() {
    "$1" -m sim.tinylm > "$2" 2>&1 &
    E3_MODEL_PID=$!
}
e3_install() {
    local mode=${1:-full} model=${2:-now} model_log=${3:-/dev/null}
    case "$mode" in full|fast) ;; *) _e3_die "unknown mode '$mode' (full or fast)"; return 1;; esac
    case "$model" in now|background) ;; *) _e3_die "unknown model build '$model' (now or background)"; return 1;; esac
    E3_MODEL_PID=""
    local venv=${E3_VENV:-$_E3_ROOT/.venv}
    local base=${PYTHON:-python3}
    local py="$venv/bin/python"
    local check=$_E3_CHECK_FAST
    [ "$mode" = full ] && check=$_E3_CHECK_FULL

    if [ -e "$venv" ] && ! "$py" -c '' >/dev/null 2>&1; then
        if [ -f "$venv/pyvenv.cfg" ]; then
            echo "install: $venv is a broken venv (its python does not run): making it again" >&2
            rm -rf "$venv"
        else
            _e3_die "$venv exists and is not a venv; move it away or set E3_VENV to another path"
            return 1
        fi
    fi
    if [ ! -e "$venv" ]; then
        echo "install: making the venv $venv (with $base)" >&2
        if ! "$base" -m venv "$venv"; then
            rm -rf "$venv"
            _e3_die "'$base -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv (or set PYTHON to a python >= 3.11 with venv)"
            return 1
        fi
    fi
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || { _e3_die "$py is older than python 3.11; set PYTHON to a newer one and remove $venv"; return 1; }

    local stamp_file="$venv/.eagle3-console-install"
    local want have=""
    want=$(_e3_stamp "$mode" "$py") || { _e3_die "cannot read $_E3_ROOT/pyproject.toml"; return 1; }
    [ -f "$stamp_file" ] && have=$(cat "$stamp_file")
    # a full install also satisfies the fast lane (the test extra is part of it)
    if { [ "$have" = "$want" ] || { [ "$mode" = fast ] && [ "$have" = "$(_e3_stamp full "$py")" ]; }; } \
        && "$py" -I -c "$check" "$_E3_ROOT" >/dev/null 2>&1; then
        echo "install: $venv is up to date ($mode)" >&2
    else
        rm -f "$stamp_file"
        # --no-compile: pip byte-compiles every module it installs (torch alone: 28 CPU-s, 10 without);
        # python compiles only what is imported, once, on first use
        local pip=("$py" -m pip install -q --disable-pip-version-check --no-compile)
        # a venv's bundled pip before 24.1 spends most of the install judging the ~100,000 files the indexes
        # list (measured: the console's step took 38 CPU-s with pip 23.2, 19 after an upgrade costing 2.5)
        if ! "$py" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (24, 1))' 2>/dev/null; then
            echo "install: upgrading the venv's pip (older than 24.1)" >&2
            "${pip[@]}" --upgrade "pip>=24.1" || echo "install: pip could not be upgraded; going on with $("$py" -m pip --version)" >&2
        fi
        if [ "$mode" = full ]; then
            # CPU torch first, alone, from the wheel on disk: asked for indirectly (as a dependency of
            # speculators), pip would fetch a multi-GB CUDA build; pinned again in the next call for the same reason.
            if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
                echo "install: installing a CPU torch 2.13.0 into $venv" >&2
                "${pip[@]}" torch==2.13.0 || { _e3_die "pip install torch==2.13.0 failed"; return 1; }
            fi
            echo "install: installing the console with the test, train and host extras into $venv" >&2
            "${pip[@]}" -e "$_E3_ROOT[test,train,host]" torch==2.13.0 \
                || { _e3_die "pip install -e '.[test,train,host]' failed"; return 1; }
            # speculators 0.9 requires torchvision and torchaudio but never imports them; the builds pip
            # picks do not match the CPU torch and break `import transformers` (operator torchvision::nms
            # does not exist). Removed here, once: the stamp keeps later runs from installing them again.
            local extra
            extra=$("$py" "$_E3_ROOT/scripts/installed_of.py" torchvision torchaudio)
            if [ -n "$extra" ]; then
                # shellcheck disable=SC2086  # one package name a line
                "$py" -m pip uninstall -q -y $extra || { _e3_die "pip uninstall $extra failed"; return 1; }
            fi
        else
            echo "install: installing the console with the test extra into $venv (fast lane: no torch)" >&2
            "${pip[@]}" -e "$_E3_ROOT[test]" || { _e3_die "pip install -e '.[test]' failed"; return 1; }
        fi
        # the build imports torch and transformers only: it need not wait for the check's ~20 CPU-s
        # (speculators and the console compiled on first import), which now overlap its first minute
        if [ "$mode" = full ] && [ "$model" = background ]; then _e3_build_model "$py" "$model_log"; fi
        local why
        if ! why=$("$py" -I -c "$check" "$_E3_ROOT" 2>&1); then
            if [ -n "$E3_MODEL_PID" ]; then kill "$E3_MODEL_PID" 2>/dev/null; E3_MODEL_PID=""; fi
            _e3_die "the $mode install in $venv does not import:"
            echo "$why" | tail -n 15 >&2
            echo "install: remove $venv and run again; if it fails the same way, report it with the lines above" >&2
            return 1
        fi
        echo "$want" > "$stamp_file"
    fi
    if [ "$mode" = full ] && [ "$model" = now ]; then
        # The stand-in's tiny verifier, built once into the user cache with progress on the terminal
        # (about a minute of CPU on first use); seconds when it is already there.
        "$py" -m sim.tinylm || { _e3_die "building the tiny verifier failed"; return 1; }
    elif [ "$mode" = full ] && [ "$model" = background ] && [ -z "$E3_MODEL_PID" ]; then
        _e3_build_model "$py" "$model_log"  # an install found up to date: seconds when the model is there
    fi
    export E3_MODEL_PID
    E3_PY=$py
    # as `activate` does: programs the tests and the demo host start by name (python3 -m sim...) are the venv's
    VIRTUAL_ENV=$venv
    PATH="$venv/bin:$PATH"
    export E3_PY VIRTUAL_ENV PATH
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    e3_install "${1:-full}"
fi
