"""The servers of the one server switch (backend/kit/switch.py), built from the profile: the baseline (home),
the extraction server, the drafter server (and a published drafter in the same unit), each with the
service manager's commands to start, stop and check it, and the plan that puts them together. The
extraction swap (extraction.py), the bench pair (bench_pair.py) and the serve switches (session.py)
all build their plan here. Pure functions, no I/O.
"""
from __future__ import annotations

from typing import Sequence

from backend.kit.serverlock import lock_path
from backend.kit.switch import ServerSpec, SwitchPlan
from console.control.server_argv import server_command
from console.control.stage_argv import nvidia_smi_prefix
from console.control.units import (ServerProgram, _sudo, server_log_path, server_start_argv, server_stop_argv,
                                   stage_log_path, tmux_target)
from console.profile import Profile

LOG_LINES = 40
SWITCH_EVENTS = "state/switches.jsonl"  # the serve switches' events, under the work dir
SWITCH_LOG = "logs/switch.log"


def alive_argv(profile: Profile, unit: str) -> list[str]:
    """Exits 0 while `unit` (a systemd unit, or a tmux session whose program has not exited) runs."""
    if profile.server.manager == "systemd":
        return ["systemctl", "is-active", "--quiet", unit]
    # tmux: the pane's program is the server; remain-on-exit keeps a dead pane, so ask whether it is dead
    script = '[ "$(tmux list-panes -t "$1" -F "#{pane_dead}" 2>/dev/null | head -n 1)" = 0 ]'
    return ["sh", "-c", script, "sh", tmux_target(unit)]


def log_tail_argv(profile: Profile, unit: str, log_path: str) -> list[str]:
    if profile.server.manager == "systemd":
        return _sudo(profile, ["journalctl", "-u", unit, "-n", str(LOG_LINES), "--no-pager", "-o", "cat"])
    return ["tail", "-n", str(LOG_LINES), log_path]


def baseline_server(profile: Profile) -> ServerSpec:
    unit = profile.server.unit
    log = server_log_path(profile)
    return ServerSpec(name="baseline", unit=unit, start=server_start_argv(profile, log), stop=server_stop_argv(profile),
                      alive=alive_argv(profile, unit), log_tail=log_tail_argv(profile, unit, log),
                      command=server_command(profile), gpus=_server_gpus(profile))


def _server_gpus(profile: Profile) -> list[int]:
    """The GPUs the baseline and every server derived from it hold (the switch sees them free first)."""
    from console.control.gpu_plan import server_gpus

    return list(server_gpus(profile))


def derived_server(profile: Profile, name: str, unit: str, start: Sequence[str], stop: Sequence[str],
                   command: Sequence[str]) -> ServerSpec:
    """A server the console derives from the baseline (extraction, drafter): its own unit beside it."""
    return ServerSpec(name=name, unit=unit, start=list(start), stop=list(stop), alive=alive_argv(profile, unit),
                      log_tail=log_tail_argv(profile, unit, stage_log_path(profile, unit)), command=list(command),
                      gpus=_server_gpus(profile))


def switch_plan(profile: Profile, away: Sequence[ServerSpec], *, ready_timeout_s: float | None = None) -> SwitchPlan:
    s = profile.server
    return SwitchPlan(home=baseline_server(profile), away=list(away), endpoint=f"http://127.0.0.1:{s.port}",
                      ready_timeout_s=float(ready_timeout_s or s.load_timeout_s),
                      command_timeout_s=s.stop_timeout_s + 60, stop_check_s=s.stop_timeout_s + 30,
                      lock_path=lock_path(profile.paths.work_dir), nvidia_smi=nvidia_smi_prefix(profile),
                      gpu_free_s=s.gpu_release_timeout_s)


def switch_argv(profile: Profile, plan_file: str, to: str) -> list[str]:
    """The serve switch, detached on the host (`python -m backend.kit.switch`): a lost SSH link never leaves the
    GPUs without a server."""
    work = profile.paths.work_dir
    return [profile.paths.python, "-m", "backend.kit.switch", "--plan", plan_file, "--to", to,
            "--events", f"{work}/{SWITCH_EVENTS}", "--detach", f"{work}/{SWITCH_LOG}"]


def serve_plan(profile: Profile, checkpoint: str | None, *, no_expand_option: bool = False,
               program: ServerProgram | None = None) -> SwitchPlan:
    """The console's serve switches: the baseline home, the drafter server with `checkpoint` away. Without a
    checkpoint (serve-baseline) the drafter server is only stopped, never started."""
    from console.control import drafter_server as ds

    unit = ds.drafter_unit(profile)
    stop = ds.drafter_stop_command(profile).argv
    if checkpoint:
        start = ds.drafter_start_command(profile, checkpoint, no_expand_option=no_expand_option, program=program).argv
        command = ds.drafter_command(profile, checkpoint, program)
    else:
        start = ["sh", "-c", "echo 'this switch only stops the drafter server' >&2; exit 1"]
        command = []
    return switch_plan(profile, [derived_server(profile, "drafter", unit, start, stop, command)])


def serve_plan_path(profile: Profile, to: str) -> str:
    return f"{profile.paths.work_dir}/plans/serve-{to}.switch.json"
