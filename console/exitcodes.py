"""The exit codes of the console's commands, defined once: scripts read them (README, "Headless commands").

Each number has one meaning wherever that could be done without breaking a script:

    0  OK            done (a run started; with --wait: completed)
    1  FAILED        failed, refused, declined at the prompt, or (profile check) found a difference
    2  USAGE         unusable input (arguments, a profile, no terminal to ask on without --yes): nothing done
    3  UNREACHABLE   the host cannot be reached (or refuses the connection before any action)

Three commands gave a number a second meaning before this table existed, and scripts rely on them, so
they keep it (a name of its own here, the same number):

    2  NOT_READY     wait-ready and run serve-* --wait: not ready in time (wait-ready: also a host that
                     refused us for good: a refused key, an unknown host key)
    3  SLOWER        run bench --wait: the drafter, at its best K, is slower than the baseline
    3  NO_DEMO       demo-host status: no demo host in that directory

And `run`, `run stop`, `runs disk` and `runs prune` say an unreachable host with 1 (FAILED), as they
always did; the other commands with 3. TABLE says, per command, what each of its numbers means; the
README's exit-code table is generated from it (`markdown()`) and tests/test_cli_exits.py checks they agree.
"""
from __future__ import annotations

OK = 0
FAILED = 1
USAGE = 2
UNREACHABLE = 3

NOT_READY = 2
SLOWER = 3
NO_DEMO = 3

_USAGE = "bad arguments or profile"

# command (as the README's table names it) -> {exit code: what it means for that command}
TABLE: dict[str, dict[int, str]] = {
    "eagle3-console --profile P / --demo (the app)": {
        OK: "quit", FAILED: "the app crashed, or the demo host did not start",
        USAGE: "no --profile nor --demo, a bad profile, [notify] or keymap"},
    "status": {OK: "the host answered", USAGE: _USAGE, UNREACHABLE: "the host is unreachable (with the reason)"},
    "wait-ready": {OK: "ready and serving the profile's model", FAILED: "the load failed (the root cause printed)",
                   NOT_READY: "not ready in time, or the host refuses our key or presents an unknown one "
                              "(it says which); also a bad profile"},
    "start-server / stop-server / restart-server": {
        OK: "done", FAILED: "refused, failed, or declined at the prompt",
        USAGE: "no terminal to ask on without --yes; " + _USAGE, UNREACHABLE: "the host is unreachable"},
    "run generate / prepare / extract / train / verify / pipeline / fetch-drafter": {
        OK: "started (--wait: completed)",
        FAILED: "the host is unreachable, the start was refused or declined, or (--wait) the run failed, "
                "stopped, or was refused on the host (its run directory held by another program)",
        USAGE: "an option the stage does not take, no terminal to ask on without --yes; " + _USAGE},
    "run bench": {OK: "started (--wait: completed, the drafter not slower)",
                  FAILED: "the host is unreachable, the start was refused or declined, or (--wait) the run "
                          "failed or stopped",
                  USAGE: "no terminal to ask on without --yes; " + _USAGE,
                  SLOWER: "--wait: completed, and the drafter (at its best K) is slower"},
    "run serve-drafter / serve-baseline": {
        OK: "switch started (--wait: the server answers)",
        FAILED: "the host is unreachable, the switch was refused or declined, or (--wait) the load failed",
        NOT_READY: "--wait: not ready within [server].load_timeout_s; also no terminal to ask on without "
                   "--yes, " + _USAGE},
    "run stop": {OK: "stop sent (--wait: it stopped, or completed first)",
                 FAILED: "the host is unreachable, nothing of that name is running, or (--wait) it failed or "
                         "died without a finish",
                 USAGE: "neither or both of STAGE and --run-id, a server named; " + _USAGE},
    "runs disk": {OK: "listed", FAILED: "the host is unreachable or could not be surveyed", USAGE: _USAGE},
    "runs prune": {OK: "deleted, or nothing to delete", FAILED: "declined at the prompt, or the host failed",
                   USAGE: "a bad --older-than, no terminal to ask on without --yes; " + _USAGE},
    "demo-host": {OK: "done (status: the demo host's snapshot)", FAILED: "start: the demo host did not start",
                  NO_DEMO: "status: no demo host in that directory"},
    "profile init": {OK: "written", USAGE: "the file exists (no --force), a bad value, or the unit could not be "
                                           "read"},
    "profile check": {OK: "valid, and its unit matches (or was not compared)",
                      FAILED: "drift between the profile and its unit, the unit is unreadable, or a leftover "
                              "server holds the profile's port",
                      USAGE: "not a valid profile"},
    "trust-host": {OK: "trusted (or already trusted)",
                   FAILED: "declined, not a fingerprint given, a changed key without --replace, or "
                           "known_hosts could not be written",
                   USAGE: "no terminal to ask on without --fingerprint; " + _USAGE,
                   UNREACHABLE: "the host (or its jump host) is unreachable or refused the login before its "
                                "key could be read"},
}

README_START = "<!-- exit-codes: generated from console/exitcodes.py; tests/test_cli_exits.py checks it -->"
README_END = "<!-- exit-codes: end -->"


def markdown() -> str:
    """The README's exit-code table (between README_START and README_END)."""
    codes = sorted({code for meanings in TABLE.values() for code in meanings})
    lines = ["| command | " + " | ".join(f"exit {c}" for c in codes) + " |",
             "| --- |" + " --- |" * len(codes)]
    for command, meanings in TABLE.items():
        lines.append(f"| `{command}` | " + " | ".join(meanings.get(c, "") for c in codes) + " |")
    return "\n".join(lines)
