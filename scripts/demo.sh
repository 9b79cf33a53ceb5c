#!/usr/bin/env bash
# Fresh machine -> the console running on the built-in SIMULATED demo host. Extra arguments go to
# eagle3-console (e.g. --demo-speed 4 or --readonly).
#
#   ./scripts/demo.sh --check   headless instead: start a demo host in a temporary dir, run the whole
#                               pipeline and the bench on it, stop it; exit 0 when every step worked,
#                               1 with the failing step named (CI runs it: tests/test_demo_script.py)
#
# Installs what the demo's whole pipeline needs through scripts/install.sh (the one install step it
# shares with scripts/test.sh): a venv (.venv, or $E3_VENV) with a CPU torch and the console with its
# extras, then the stand-in's tiny verifier, built once. First start on a fresh machine: a few minutes
# (downloads, then about a minute of CPU for the tiny model); later starts: seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v tmux >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tmux >/dev/null
    else echo "tmux is needed for the demo host: sudo apt-get install tmux" >&2; exit 1; fi
fi
# shellcheck source=scripts/install.sh
. scripts/install.sh
e3_install full || exit 1

if [ "${1:-}" != "--check" ]; then
    exec "$E3_PY" -m console.cli --demo "$@"
fi

# --check: the operator's headless path (README, "Headless commands") on a private demo host.
# E3_CHECK_LIMIT: records the pipeline generates (the demo dataset has 500; a few dozen keep it quick).
limit=${E3_CHECK_LIMIT:-60}
work=$(mktemp -d "${TMPDIR:-/tmp}/eagle3-demo-check.XXXXXX")
cli() { "$E3_PY" -m console.cli "$@" </dev/null; }
step() { echo "demo --check: $*" >&2; }
fail() { echo "demo --check: FAILED at step: $*" >&2; exit 1; }
cleanup() {
    cli demo-host stop --dir "$work/demo" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
started=$SECONDS

step "demo-host start --dir $work/demo"
profile=$(cli demo-host start --dir "$work/demo" --speed 10) || fail "demo-host start"
step "wait-ready (the stand-in loads)"
cli wait-ready --profile "$profile" --timeout 180 || fail "wait-ready"
step "run pipeline --limit $limit --yes --wait (generate, prepare, extract, train, verify)"
cli run pipeline --profile "$profile" --limit "$limit" --run-id check --yes --wait || fail "run pipeline"
step "run bench --yes --wait (baseline, the drafter server, back to the baseline)"
rc=0
cli run bench --profile "$profile" --run-id check-bench --yes --wait || rc=$?
# 3: the bench completed and found the drafter slower; on the toy model that is a measurement, not a fault
[ "$rc" = 0 ] || [ "$rc" = 3 ] || fail "run bench (exit $rc)"
[ "$rc" = 3 ] && step "the bench completed; the drafter was slower than the baseline on this run (exit 3)"
step "demo-host stop"
cli demo-host stop --dir "$work/demo" || fail "demo-host stop"
step "all steps passed in $((SECONDS - started)) s (after the install)"
