"""The drafter server: the baseline's own program (units.ServerProgram: the operator's unit's command line,
environment, user and working directory; tmux: the profile's command) plus
`--speculative-config` (method eagle3, the verified checkpoint, [drafter].num_speculative_tokens draft
tokens per step, [serve_drafter].draft_tensor_parallel_size), run as its own program beside the baseline's name
(`<server unit>-drafter`): a transient systemd unit, or its own tmux session, started and stopped with
units.derived_server_start_argv and stopped like a stage. Pure functions, no I/O; the caller stops the baseline
first (one server at a time on the GPUs) and starts it again when switching back.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from backend.kit.redact import shown
from console.control.server_argv import ServerArgvError, target_tp
from console.control.units import (HostCommand, ServerProgram, checked_session, checked_unit,
                                   derived_server_start_argv, profile_program, stage_stop_command, tmux_stop_argv)
from console.naming import SERVERS, drafter_log_path, drafter_unit, server_log, server_unit  # noqa: F401
from console.profile import Profile, check_path

METHOD = "eagle3"
# flags the drafter server sets itself; a baseline command line that has one cannot be extended
_OWN_FLAGS = ("--speculative-config", "--speculative_config")


class DrafterServerError(ValueError):
    """The profile cannot give a drafter server; the message says which value and why."""


def live_servers_argv(profile: Profile) -> list[str]:
    """Asks the service manager which of the two servers runs now (whatever the console last saw)."""
    if profile.server.manager == "systemd":
        units = [checked_unit(server_unit(profile, w)) for w in SERVERS]
        return ["systemctl", "show", *units, "-p", "Id,ActiveState"]
    for w in SERVERS:
        checked_session(server_unit(profile, w))
    return ["tmux", "list-panes", "-a", "-F", "#{session_name} #{pane_dead}"]


def parse_live_servers(profile: Profile, text: str) -> set[str]:
    """The servers (of SERVERS) the answer to live_servers_argv says are running or starting."""
    names = {server_unit(profile, w): w for w in SERVERS}
    live: set[str] = set()
    if profile.server.manager == "systemd":
        unit = None
        for line in text.splitlines():
            key, _, value = line.strip().partition("=")
            if key == "Id":
                unit = value.removesuffix(".service")
            elif key == "ActiveState" and unit in names and value in ("active", "activating", "reloading"):
                live.add(names[unit])
        return live
    for line in text.splitlines():
        bits = line.split()
        if len(bits) == 2 and bits[0] in names and bits[1] == "0":
            live.add(names[bits[0]])
    return live


def servable_argv(profile: Profile, run: str | None = None, *, third: bool = False) -> list[str]:
    """Asks the host for the verified checkpoint to serve (backend/ask.py, backend/kit/servable.py): the latest
    completed verify run's, or that of `run` (a verify run, or a train run a verify run verified); `third`:
    the fetched published drafter's, once verified."""
    argv = [profile.paths.python, "-m", "backend.ask", "servable", "--work-dir", profile.paths.work_dir]
    return argv + (["--run", run] if run else []) + (["--third"] if third else [])


def speculative_config(checkpoint: str, num_speculative_tokens: int, draft_tp: int) -> dict[str, Any]:
    return {"method": METHOD, "model": checkpoint, "num_speculative_tokens": num_speculative_tokens,
            "draft_tensor_parallel_size": draft_tp}


def _drafter_flags(profile: Profile, checkpoint: str, program: ServerProgram, k: int | None = None) -> list[str]:
    err = check_path(checkpoint)
    if err:
        raise DrafterServerError(f"drafter checkpoint {checkpoint!r}: expected {err}")
    base = list(program.argv)
    clash = sorted({a.split("=", 1)[0] for a in base if a.split("=", 1)[0] in _OWN_FLAGS})
    if clash:
        where = program.source if program.source != "the profile" else "server.vllm_args or server.command"
        raise DrafterServerError(f"the server's command line already has {', '.join(clash)} ({where}): the "
                                 f"drafter server adds its own; take it out of the baseline's arguments")
    draft_tp = profile.serve_drafter.draft_tensor_parallel_size
    try:
        tp = target_tp(base)
    except ServerArgvError as e:
        raise DrafterServerError(str(e)) from None
    if draft_tp not in (1, tp):
        raise DrafterServerError(f"serve_drafter.draft_tensor_parallel_size {draft_tp}: vLLM takes 1 or the "
                                 f"target's tensor-parallel size ({tp})")
    spec = speculative_config(checkpoint, k or profile.drafter.num_speculative_tokens, draft_tp)
    return ["--speculative-config", json.dumps(spec, separators=(",", ":"))]


def drafter_command(profile: Profile, checkpoint: str, program: ServerProgram | None = None, *,
                    k: int | None = None) -> list[str]:
    """The drafter server's command line (see the module docstring). `program`: the baseline's
    (operator_unit.read_server_program); default the profile's command. `k`: draft tokens per step
    instead of [drafter].num_speculative_tokens (the bench of several K)."""
    program = program or profile_program(profile)
    return [*program.argv, *_drafter_flags(profile, checkpoint, program, k)]


def drafter_start_command(profile: Profile, checkpoint: str, env: Mapping[str, str] | None = None, *,
                          no_expand_option: bool = False, program: ServerProgram | None = None,
                          k: int | None = None) -> HostCommand:
    """Start the drafter server with the baseline's environment and user (`env` on top). The unit's
    command line keeps systemd's `$VAR` expansion, so `no_expand_option` is not used here: the drafter's
    own flags are escaped instead (units.derived_server_start_argv). `k`: as drafter_command's."""
    del no_expand_option
    unit = drafter_unit(profile)
    program = program or profile_program(profile)
    flags = _drafter_flags(profile, checkpoint, program, k)
    argv = derived_server_start_argv(profile, unit, program, flags, log_path=drafter_log_path(profile), env=env)
    if profile.server.manager == "systemd":
        text = shown(argv)
    else:
        text = f"tmux start session {unit}: {shown([*program.argv, *flags])}"
    return HostCommand(argv, text)


def drafter_stop_command(profile: Profile) -> HostCommand:
    unit = drafter_unit(profile)
    if profile.server.manager == "systemd":
        return stage_stop_command(profile, unit)
    # a server may take longer than a stage to exit: the profile's own stop timeout, as for the baseline
    argv = tmux_stop_argv(unit, profile.server.stop_timeout_s)
    return HostCommand(argv, f"tmux stop (SIGTERM, then wait) session {unit}")
