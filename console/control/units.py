"""Start and stop long-running programs on the host, detached from the console's SSH session.

systemd: the server is the operator's unit (`systemctl start|stop|restart`); stages run as transient
units (`systemd-run --unit=... --collect`), logging to the journal. tmux (hosts without systemd, and the
demo): one session per program, the pane's process IS the program (so its pid takes SIGTERM and its exit
status is kept by remain-on-exit), its output tee'd to a log file the console reads by offset.
Every function returns argv lists; callers run them with Host.run and show them to the operator.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Mapping, Sequence

from console.profile import Profile


def stage_unit_name(stage: str, run_id: str) -> str:
    """The systemd unit or tmux session of a stage run (the run id rule keeps it a valid name)."""
    return f"e3-{stage}-{run_id}"


def server_log_path(profile: Profile) -> str:
    """Where the tmux manager's server writes its output (tee'd from the pane)."""
    return f"{profile.paths.work_dir}/logs/{profile.server.unit}.log"


def stage_log_path(profile: Profile, unit: str) -> str:
    """tmux manager: a stage's output (kept out of the run dir, which the stage alone owns)."""
    return f"{profile.paths.work_dir}/logs/{unit}.log"


def _sudo(profile: Profile, argv: list[str]) -> list[str]:
    return ["sudo", "-n", *argv] if profile.server.sudo else argv


def server_command(profile: Profile) -> list[str]:
    s = profile.server
    if s.command:
        return list(s.command)
    argv = ["vllm", "serve", s.model_path, "--host", "127.0.0.1", "--port", str(s.port)]
    if s.served_model_name:
        argv += ["--served-model-name", s.served_model_name]
    if s.reasoning_parser and "--reasoning-parser" not in s.vllm_args:
        argv += ["--reasoning-parser", s.reasoning_parser]
    return argv + list(s.vllm_args)


def tmux_start_argv(session: str, argv: Sequence[str], log_path: str, *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> list[str]:
    """One `sh -c` that refuses a live session, clears a dead one, and starts `argv` in a fresh one."""
    log_dir = log_path.rsplit("/", 1)[0] or "/"
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())
    cd = f"cd {shlex.quote(cwd)} && " if cwd else ""
    # exec twice: output goes through tee into the log, and the program replaces the shell as the pane's
    # process, so SIGTERM reaches it and tmux records its own exit status
    inner = f"{exports}{cd}exec > >(tee -a {shlex.quote(log_path)}) 2>&1; exec {shlex.join(list(argv))}"
    t = f"={session}"
    log = shlex.quote(log_path)
    script = "\n".join([
        f"mkdir -p {shlex.quote(log_dir)} || exit 1",
        f"if tmux has-session -t {shlex.quote(t)} 2>/dev/null; then",
        f"  if tmux list-panes -t {shlex.quote(t)} -F '#{{pane_dead}}' | grep -q 0; then",
        f"    echo {shlex.quote(f'tmux session {session} is already running')} >&2; exit 3",
        "  fi",
        f"  tmux kill-session -t {shlex.quote(t)}",
        "fi",
        # each start gets a fresh log, so a reader never takes the previous program's last lines
        # (an old failure) for this one's; the previous log is kept beside it
        f"if [ -e {log} ]; then mv -f {log} {log}.1; fi",
        f"tmux new-session -d -s {shlex.quote(session)} -x 200 -y 50 || exit 1",
        f"tmux set-window-option -t {shlex.quote(t + ':')} remain-on-exit on >/dev/null || exit 1",
        f"tmux respawn-pane -k -t {shlex.quote(t + ':')} {shlex.quote(shlex.join(['bash', '-c', inner]))}",
    ])
    return ["sh", "-c", script]


def tmux_stop_argv(session: str, timeout_s: float) -> list[str]:
    """SIGTERM the pane's program, wait for it to exit (then SIGKILL), then remove the session."""
    t = shlex.quote(f"={session}")
    # "exited" is tmux's pane_dead, not `kill -0`: the exited program can linger as a zombie
    dead = f"[ \"$(tmux list-panes -t {t} -F '#{{pane_dead}}' 2>/dev/null | head -n 1)\" != 0 ]"
    script = "\n".join([
        f"pid=$(tmux list-panes -t {t} -F '#{{pane_pid}} #{{pane_dead}}' 2>/dev/null | awk '$2==0{{print $1; exit}}')",
        'if [ -n "$pid" ]; then',
        '  kill -TERM "$pid" 2>/dev/null',
        f"  i=0; while [ $i -lt {int(timeout_s * 5)} ]; do",
        f"    {dead} && break",
        "    sleep 0.2; i=$((i+1))",
        "  done",
        f'  {dead} || {{ echo "did not exit in {timeout_s:g} s: SIGKILL" >&2; kill -KILL "$pid"; }}',
        "fi",
        f"tmux kill-session -t {t} 2>/dev/null",
        "exit 0",
    ])
    return ["sh", "-c", script]


def server_start_argv(profile: Profile, log_path: str) -> list[str]:
    if profile.server.manager == "systemd":
        return _sudo(profile, ["systemctl", "start", profile.server.unit])
    return tmux_start_argv(profile.server.unit, server_command(profile), log_path, cwd=profile.paths.work_dir)


def server_stop_argv(profile: Profile) -> list[str]:
    if profile.server.manager == "systemd":
        return _sudo(profile, ["systemctl", "stop", profile.server.unit])
    return tmux_stop_argv(profile.server.unit, profile.server.stop_timeout_s)


def server_restart_argvs(profile: Profile, log_path: str) -> list[list[str]]:
    if profile.server.manager == "systemd":
        return [_sudo(profile, ["systemctl", "restart", profile.server.unit])]
    return [server_stop_argv(profile), server_start_argv(profile, log_path)]


def stage_start_argv(profile: Profile, unit: str, argv: Sequence[str], *, log_path: str, cwd: str,
                     env: Mapping[str, str]) -> list[str]:
    if profile.server.manager == "systemd":
        cmd = ["systemd-run", f"--unit={unit}", "--collect", "--quiet", f"--working-directory={cwd}",
               "--property=KillSignal=SIGTERM", "--property=TimeoutStopSec=120"]
        cmd += [f"--setenv={k}={v}" for k, v in env.items()]
        return _sudo(profile, cmd + list(argv))
    return tmux_start_argv(unit, argv, log_path, cwd=cwd, env=env)


def stage_stop_argv(profile: Profile, unit: str) -> list[str]:
    if profile.server.manager == "systemd":
        return _sudo(profile, ["systemctl", "stop", unit])
    return tmux_stop_argv(unit, 120)


@dataclass(frozen=True)
class HostCommand:
    """A command for the host and the way the operator reads it: the program and its arguments, not
    the shell plumbing (a tmux start is a whole script) around them."""
    argv: list[str]
    shown: str


def _shown(profile: Profile, what: str, unit: str, argv: list[str], program: Sequence[str] | None = None) -> str:
    if profile.server.manager == "systemd" or program is None:
        return shlex.join(argv)
    return f"tmux {what} session {unit}: {shlex.join(list(program))}" if program else f"tmux {what} session {unit}"


def server_start_command(profile: Profile) -> HostCommand:
    argv = server_start_argv(profile, server_log_path(profile))
    return HostCommand(argv, _shown(profile, "start", profile.server.unit, argv, server_command(profile)))


def server_stop_command(profile: Profile) -> HostCommand:
    argv = server_stop_argv(profile)
    return HostCommand(argv, _shown(profile, "stop (SIGTERM, then wait)", profile.server.unit, argv, ()))


def server_restart_commands(profile: Profile) -> list[HostCommand]:
    if profile.server.manager == "systemd":
        argv = server_restart_argvs(profile, server_log_path(profile))[0]
        return [HostCommand(argv, shlex.join(argv))]
    return [server_stop_command(profile), server_start_command(profile)]


def stage_start_command(profile: Profile, unit: str, argv: Sequence[str], *, log_path: str, cwd: str,
                        env: Mapping[str, str]) -> HostCommand:
    full = stage_start_argv(profile, unit, argv, log_path=log_path, cwd=cwd, env=env)
    return HostCommand(full, _shown(profile, "start", unit, full, argv))


def stage_stop_command(profile: Profile, unit: str) -> HostCommand:
    argv = stage_stop_argv(profile, unit)
    return HostCommand(argv, _shown(profile, "stop (SIGTERM, then wait)", unit, argv, ()))


def live_stage_units_argv(profile: Profile, stage: str) -> list[str]:
    """Lists the stage's units that are running now, whatever their runs' events say (a run just
    started has written none yet)."""
    if profile.server.manager == "systemd":
        return ["systemctl", "list-units", "--plain", "--no-legend", "--all", "--state=active,activating",
                f"{stage_unit_name(stage, '')}*"]
    return ["tmux", "list-panes", "-a", "-F", "#{session_name} #{pane_dead}"]


def parse_live_stage_units(profile: Profile, stage: str, text: str) -> list[str]:
    prefix = stage_unit_name(stage, "")
    live = []
    for line in text.splitlines():
        bits = line.split()
        if not bits or not bits[0].startswith(prefix):
            continue
        if profile.server.manager == "systemd":
            live.append(bits[0].removesuffix(".service"))
        elif len(bits) == 2 and bits[1] == "0":  # tmux: a pane still alive
            live.append(bits[0])
    return sorted(set(live))
