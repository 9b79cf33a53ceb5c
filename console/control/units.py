"""Start and stop long-running programs on the host, detached from the console's SSH session.

systemd: the server is the operator's unit (`systemctl start|stop|restart`); stages run as transient
units (`systemd-run --unit=... --collect`), logging to the journal. tmux (hosts without systemd, and the
demo): one session per program whose pane runs a small bash wrapper (see `tmux_start_argv`).
Every function returns argv lists; callers run them with Host.run and show them to the operator.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Mapping, Sequence

from backend.contract.runs import RUN_ID_PATTERN
from console.control import stages as stage_table
from console.parsers.tmux import EXIT_STATUS_PREFIX
# the names live one layer down (telemetry reads them too); imported here for the command builders below
from console import naming
from console.naming import exit_status_path, server_log_path, stage_log_path, stage_unit_name, tmux_target  # noqa: F401
from console.control.server_argv import server_command
from console.profile import Profile, check_session, check_unit


class UnitNameError(ValueError):
    """A unit or tmux session name that must not reach systemd or tmux (the message says why)."""


def checked_session(session: str) -> str:
    """tmux reads '.' and ':' in a target as window/pane separators and '#' as a format: refuse them
    (and a trailing newline) before any name reaches tmux."""
    problem = check_session(session)
    if problem:
        raise UnitNameError(f"tmux session {session!r}: expected {problem}")
    return session


def checked_unit(unit: str) -> str:
    problem = check_unit(unit)
    if problem:
        raise UnitNameError(f"unit {unit!r}: expected {problem}")
    return unit


def _sudo(profile: Profile, argv: list[str]) -> list[str]:
    return ["sudo", "-n", *argv] if profile.server.sudo else argv


@dataclass(frozen=True)
class ServerProgram:
    """The baseline's program, which every server the console derives (extraction, drafter) starts from:
    its command line, environment, user and working directory. systemd: the operator's unit as systemd
    runs it (console/control/operator_unit.read_server_program); tmux: the profile's command."""
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()  # the unit's Environment=, in order (a later name wins)
    env_files: tuple[tuple[str, bool], ...] = ()  # the unit's EnvironmentFile= (path, missing is ok)
    user: str | None = None
    group: str | None = None
    working_dir: str | None = None  # systemd's spelling: `~`, a `!` prefix when a missing one is ok
    source: str = "the profile"
    note: str | None = None  # what the operator should know about how it was read
    # argv as systemd stored it (a unit's ExecStart): its `$VAR`s are systemd's to expand; False: literal words
    systemd_syntax: bool = False


def profile_program(profile: Profile) -> ServerProgram:
    """The profile's command (tmux; and what a caller gets that has not read the unit), in the work dir."""
    return ServerProgram(tuple(server_command(profile)), working_dir=profile.paths.work_dir)


def _systemd_working_dir(value: str) -> str:
    """systemctl show's WorkingDirectory (`!/x`: missing is ok) in a unit file's spelling (`-/x`)."""
    return f"-{value[1:]}" if value.startswith("!") else value


def derived_server_start_argv(profile: Profile, unit: str, program: ServerProgram, extra: Sequence[str], *,
                              log_path: str, env: Mapping[str, str] | None = None,
                              stop_timeout_s: float = 120.0) -> list[str]:
    """Start a server derived from the baseline (`program`) plus its own flags (`extra`), detached as its
    own program `unit`: with the baseline's environment (its Environment= and EnvironmentFile=, as systemd
    orders them: the files' values win), user, group and working directory, and `env` on top (the
    files still win over it, as in systemd). The unit's command line is passed as systemd stored it, so
    its `$VAR`s expand from that same environment exactly as in the operator's unit; `extra` (and a
    profile's command) is escaped (`$$`) so a path or JSON holding `$` arrives as written."""
    merged = {**dict(program.env), **dict(env or {})}
    if profile.server.manager != "systemd":
        return tmux_start_argv(unit, [*program.argv, *extra], log_path, cwd=profile.paths.work_dir, env=merged)
    wd = program.working_dir
    cmd = ["systemd-run", f"--unit={checked_unit(unit)}", "--collect", "--quiet"]
    if wd is None:  # systemd's own default for a system service
        cmd.append("--working-directory=/")
    elif wd.startswith("/"):
        cmd.append(f"--working-directory={wd}")
    else:
        cmd.append(f"--property=WorkingDirectory={_systemd_working_dir(wd)}")
    cmd += ["--property=KillSignal=SIGTERM", f"--property=TimeoutStopSec={stop_timeout_s:g}"]
    if program.user:
        cmd.append(f"--uid={program.user}")
    if program.group:
        cmd.append(f"--gid={program.group}")
    cmd += [f"--property=EnvironmentFile={'-' if ok else ''}{path}" for path, ok in program.env_files]
    cmd += [f"--setenv={k}={v}" for k, v in merged.items()]
    base = list(program.argv) if program.systemd_syntax else systemd_literal_argv(program.argv)
    return _sudo(profile, [*cmd, *base, *systemd_literal_argv(extra)])


def is_stage_unit(name: object) -> bool:
    """Whether `name` is a unit this project starts a stage in (`stage_unit_name` of a stage in the stage
    table and a valid run id). A run's events name the unit it runs in; any other name (a hostile or
    foreign writer naming the operator's vLLM unit, sshd, a unit with an odd character) is not believed:
    the console would ask it whether the run is alive and, on `stop`, stop it."""
    return naming.is_stage_unit(name, stage_table.names())


# The pane's process. The program appends its output to the log file itself, so every line it wrote is
# there the moment it exits (a `tee` in the pane died with the pane's hang-up before draining, and the
# last lines, the root cause, were lost). The pane only shows the log (`tail -F`, for an attached
# operator). The wrapper forwards TERM/INT/HUP to the program, waits for it, and writes its exit status
# to a file before exiting with it: tmux's pane_dead_status can be empty when the pane's hang-up is
# seen before the exit. $1 log, $2 status file, $3 working directory ('' for none), then the program.
# No single quotes inside: it is quoted twice on its way (sh -c, then tmux), and each would grow.
_WRAPPER = """unset E3_WRAPPER; l=$1; s=$2; d=$3; shift 3
rm -f -- "$s"
if [ -n "$d" ] && ! cd -- "$d"; then echo "cannot cd to $d" >> "$l"; echo 1 > "$s"; exit 1; fi
o=$(stat -c %s -- "$l" 2>/dev/null || echo 0)
tail -c "+$((o + 1))" -F -- "$l" 2>/dev/null & v=$!
"$@" >> "$l" 2>&1 < /dev/null & c=$!
for g in TERM INT HUP; do trap "t=1; kill -$g $c 2>/dev/null" $g; done
while :; do
  t=0; wait $c; r=$?
  [ $t = 1 ] || break
  kill -0 $c 2>/dev/null && continue
  wait $c; q=$?; [ $q = 127 ] || r=$q; break
done
kill $v 2>/dev/null
echo $r > "$s.tmp" && mv -f -- "$s.tmp" "$s"
exit $r"""


def tmux_start_argv(session: str, argv: Sequence[str], log_path: str, *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> list[str]:
    """One `sh -c` that refuses a live session, clears a dead one, and starts `argv` in a fresh one.

    The wrapper travels in the session's environment (set-environment), so the pane's command, the
    end of what the command log shows, stays the program's own argv."""
    checked_session(session)
    log_dir = log_path.rsplit("/", 1)[0] or "/"
    status = exit_status_path(log_path)
    env_argv = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
    # tmux runs this with sh -c, in the session's environment: "$E3_WRAPPER" is the script above
    pane = 'bash -c "$E3_WRAPPER" ' + shlex.join(["e3-wrapper", log_path, status, cwd or "", *env_argv, *argv])
    t = tmux_target(session)
    # Sessions are addressed by their unique id ($N) once found, never again by name: a stop still
    # running must not remove the session this start creates under the same name, nor this start a
    # session another start just created.
    script = "\n".join([
        f"mkdir -p {shlex.quote(log_dir)} || exit 1",
        f"old=$(tmux list-panes -t {shlex.quote(t)} -F '#{{session_id}} #{{pane_dead}}' 2>/dev/null)",
        'if [ -n "$old" ]; then',
        '  if printf "%s\\n" "$old" | grep -q " 0$"; then',
        f"    echo {shlex.quote(f'tmux session {session} is already running')} >&2; exit 3",
        "  fi",
        '  tmux kill-session -t "${old%% *}"',
        "fi",
        # each start gets a fresh log, so a reader never takes the previous program's last lines
        # (an old failure) for this one's; the previous log is kept beside it
        f"if [ -e {shlex.quote(log_path)} ]; then mv -f {shlex.quote(log_path)} {shlex.quote(log_path + '.1')}; fi",
        f"rm -f {shlex.quote(status)}",
        f"sid=$(tmux new-session -d -P -F '#{{session_id}}' -s {shlex.quote(session)} -x 200 -y 50) || exit 1",
        'tmux set-window-option -t "$sid:" remain-on-exit on >/dev/null || exit 1',
        f'tmux set-environment -t "$sid" E3_WRAPPER {shlex.quote(_WRAPPER)} || exit 1',
        f'tmux respawn-pane -k -t "$sid:" {shlex.quote(pane)}',
    ])
    return ["sh", "-c", script]


def tmux_stop_argv(session: str, timeout_s: float) -> list[str]:
    """SIGTERM the pane's program (through its wrapper), wait for it to exit, else SIGKILL the pane's
    whole process group (wrapper and program); then remove that session, and only that one.

    "That one" is the session id together with the pane's pid: the operator may start the program
    again the moment its pane is dead, while this stop still runs, and a new tmux server (the old one
    exits with its last session) hands out the same session ids again."""
    t = shlex.quote(tmux_target(checked_session(session)))
    # "exited" is tmux's pane_dead, not `kill -0`: the exited program can linger as a zombie; a pane
    # that is gone, or holds another process, counts as exited too
    ours = "\"$(tmux list-panes -t \"$sid\" -F '#{pane_pid} #{pane_dead}' 2>/dev/null | head -n 1)\""
    dead = f'[ {ours} != "$pid 0" ]'
    script = "\n".join([
        f"info=$(tmux list-panes -t {t} -F '#{{session_id}} #{{pane_pid}} #{{pane_dead}}' 2>/dev/null | head -n 1)",
        '[ -n "$info" ] || exit 0',
        "set -- $info; sid=$1; pid=$2",
        'if [ "$3" = 0 ]; then',
        '  kill -TERM "$pid" 2>/dev/null',
        f"  i=0; while [ $i -lt {int(timeout_s * 5)} ]; do",
        f"    {dead} && break",
        "    sleep 0.2; i=$((i+1))",
        "  done",
        # the pane's process leads its own process group: the program dies with its wrapper
        f'  {dead} || {{ echo "did not exit in {timeout_s:g} s: SIGKILL" >&2;',
        '    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid"; }',
        "fi",
        # asked and done in one command of the tmux server: between a check here and a kill-session after
        # it, a start could remove this session and make a new one under the same id
        'tmux if-shell -F -t "$sid" "#{==:#{pane_pid},$pid}" "kill-session -t \'$sid\'" 2>/dev/null',
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


def systemd_literal_argv(argv: Sequence[str]) -> list[str]:
    """`argv` for a systemd that expands `$VAR`/`${VAR}` in a command line and has no
    --expand-environment=no (before v254): `$$` is its escape for a literal `$`."""
    return [a.replace("$", "$$") for a in argv]


def stage_start_argv(profile: Profile, unit: str, argv: Sequence[str], *, log_path: str, cwd: str,
                     env: Mapping[str, str], no_expand_option: bool = False,
                     stop_timeout_s: float = 120.0) -> list[str]:
    """Start a stage detached. systemd expands environment variables in a transient unit's command
    line (systemd-run's default from v254, the service manager's own before): a dataset path or a
    chat_template_kwargs value holding `$` would be rewritten silently. With `no_expand_option`
    (systemd-run knows --expand-environment, see launch.systemd_run_expands) it is switched off,
    otherwise every `$` is escaped."""
    if profile.server.manager == "systemd":
        cmd = ["systemd-run", f"--unit={checked_unit(unit)}", "--collect", "--quiet",
               f"--working-directory={cwd}", "--property=KillSignal=SIGTERM",
               f"--property=TimeoutStopSec={stop_timeout_s:g}"]
        cmd += [f"--setenv={k}={v}" for k, v in env.items()]
        if no_expand_option:
            return _sudo(profile, [*cmd, "--expand-environment=no", *argv])
        return _sudo(profile, [*cmd, *systemd_literal_argv(argv)])
    return tmux_start_argv(unit, argv, log_path, cwd=cwd, env=env)


def stage_stop_argv(profile: Profile, unit: str, stop_timeout_s: float = 120.0) -> list[str]:
    """systemd keeps the TimeoutStopSec the start gave the unit; under tmux the wait before SIGKILL is
    `stop_timeout_s`, the same budget (launch.stage_stop_timeout)."""
    if profile.server.manager == "systemd":
        return _sudo(profile, ["systemctl", "stop", checked_unit(unit)])
    return tmux_stop_argv(unit, stop_timeout_s)


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
                        env: Mapping[str, str], no_expand_option: bool = False,
                        stop_timeout_s: float = 120.0) -> HostCommand:
    full = stage_start_argv(profile, unit, argv, log_path=log_path, cwd=cwd, env=env,
                            no_expand_option=no_expand_option, stop_timeout_s=stop_timeout_s)
    return HostCommand(full, _shown(profile, "start", unit, full, argv))


def stage_stop_command(profile: Profile, unit: str, stop_timeout_s: float = 120.0) -> HostCommand:
    argv = stage_stop_argv(profile, unit, stop_timeout_s)
    return HostCommand(argv, _shown(profile, "stop (SIGTERM, then wait)", unit, argv, ()))


def live_stage_units_argv(profile: Profile, stage: str) -> list[str]:
    """Lists the stage's units that are running now, whatever their runs' events say (a run just
    started has written none yet)."""
    if profile.server.manager == "systemd":
        return ["systemctl", "list-units", "--plain", "--no-legend", "--all", "--state=active,activating",
                f"{stage_unit_name(stage, '')}*"]
    return ["tmux", "list-panes", "-a", "-F", "#{session_name} #{pane_dead}"]


def parse_live_stage_units(profile: Profile, stage: str, text: str) -> list[str]:
    """The stage's live units in a listing. Only names this console gives (the stage's prefix and a
    valid run id, whole): they end up in messages on the operator's terminal, so anything else the
    listing holds is not one of ours and is left out."""
    prefix = stage_unit_name(stage, "")
    live = []
    for line in text.splitlines():
        bits = line.split()
        if not bits or not bits[0].startswith(prefix):
            continue
        if profile.server.manager == "systemd":
            name = bits[0].removesuffix(".service")
        elif len(bits) == 2 and bits[1] == "0":  # tmux: a pane still alive
            name = bits[0]
        else:
            continue
        if RUN_ID_PATTERN.fullmatch(name[len(prefix):]):
            live.append(name)
    return sorted(set(live))
