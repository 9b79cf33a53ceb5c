"""Read the operator's unit from the host: the program every derived server (extraction, drafter) starts
from. systemd: `systemctl show` for the environment, user and working directory, and the exact command
line from the D-Bus property (busctl's JSON; systemctl show's own text joins the arguments with spaces,
the fallback when busctl cannot answer). tmux: the profile's command, nothing to read."""
from __future__ import annotations

from console.control.units import ServerProgram, checked_unit, profile_program
from backend.kit.gpu_owners import parallel_error
from console.host.base import Host
from console.parsers.systemd_unit import (UnitDefinition, UnitReadError, exec_start_json_argv, parse_exec_json,
                                          parse_unit_show, server_exec, show_argv)
from console.parsers.vllm_cmdline import CmdlineError, ServeSettings, read_serve_argv
from console.profile import Profile

READ_TIMEOUT_S = 30.0


class OperatorUnitError(RuntimeError):
    """The operator's unit could not be read; the message says which command answered what."""


def program_from_unit(defn: UnitDefinition, exact_text: str | None = None) -> ServerProgram:
    """The server program of a unit (`exact_text`: busctl's ExecStart JSON, when it answered)."""
    command = server_exec(defn)
    note = None
    if exact_text is not None:
        exact = parse_exec_json(exact_text)
        if len(exact) == 1:
            command = exact[0]
    if not command.exact:
        note = (f"the command line of {defn.unit} comes from systemctl show, which joins arguments with spaces "
                f"(busctl did not answer): an argument holding a space would be split")
    return ServerProgram(argv=tuple(command.command), env=defn.environment, env_files=defn.environment_files,
                         user=defn.user, group=defn.group, working_dir=defn.working_directory,
                         source=f"unit {defn.unit}", note=note, systemd_syntax=True)


async def read_unit(host: Host, unit: str) -> tuple[UnitDefinition, str | None]:
    """The unit's definition, and busctl's exact ExecStart answer (None when busctl could not answer)."""
    res = await host.run(show_argv(checked_unit(unit)), timeout=READ_TIMEOUT_S)
    if not res.ok:
        raise OperatorUnitError(f"systemctl show {unit} failed (exit {res.returncode}): "
                                f"{(res.stderr or res.stdout).strip()[:500]}")
    try:
        defn = parse_unit_show(res.stdout, unit)
    except UnitReadError as exc:
        raise OperatorUnitError(f"systemctl show {unit}: {exc}") from None
    exact = await host.run(exec_start_json_argv(unit), timeout=READ_TIMEOUT_S)
    return defn, (exact.stdout if exact.ok else None)


async def read_server_program(host: Host, profile: Profile) -> ServerProgram:
    """The baseline's program as the derived servers start from it (see the module docstring)."""
    if profile.server.manager != "systemd":
        return profile_program(profile)
    defn, exact = await read_unit(host, profile.server.unit)
    try:
        return program_from_unit(defn, exact)
    except UnitReadError as exc:
        raise OperatorUnitError(f"the operator's unit {profile.server.unit}: {exc}") from None


def unit_user_refusal(program: ServerProgram, unit: str, ssh_user: str, work_dir: str) -> str | None:
    """Why the servers derived from the unit (they run as its User=) cannot take part in a swap: the
    extraction server writes the connector's staging dir and the switch opens the server lock under the
    work dir, which the SSH user's commands create; a third user can do neither. None: root, or the SSH
    user, or no User= (a system unit runs as root)."""
    user = program.user
    if not user or user in ("root", "0", ssh_user):
        return None
    owners = ssh_user if ssh_user == "root" else f"{ssh_user} or root"
    return (f"the unit {unit} runs as User={user}, the SSH user is {ssh_user}: the extraction server runs as "
            f"{user} and could not write its staging dir under {work_dir}/extract-staging nor open the server "
            f"lock under {work_dir}/state, which {ssh_user} creates. Fix: connect as {user} ([host].user = "
            f"\"{user}\" in the profile), or run the unit as {owners} (User= in the unit, e.g. a "
            f"`systemctl edit {unit}` drop-in); nothing was stopped")


def unit_settings(program: ServerProgram) -> ServeSettings:
    """What the unit's server serves (raises CmdlineError when its command line is not `vllm serve`, or
    asks for a tensor-parallel size no host has: the bound is the GPU plan's, checked here because the
    parser imports nothing of the host side)."""
    settings = read_serve_argv(program.argv)
    error = parallel_error(settings.tensor_parallel_size)
    if error:
        raise CmdlineError(f"--tensor-parallel-size {settings.tensor_parallel_size}: {error}")
    return settings


def profile_server_values(settings: ServeSettings) -> dict[str, object]:
    """The [server] values of a profile for a unit serving `settings` (profile init --from-unit)."""
    values: dict[str, object] = {"model_path": settings.model, "port": settings.port}
    if settings.served_model_names:
        values["served_model_name"] = settings.served_id
    if settings.reasoning_parser:
        values["reasoning_parser"] = settings.reasoning_parser
    args = ["--tensor-parallel-size", str(settings.tensor_parallel_size)]
    values["vllm_args"] = args + (["--trust-remote-code"] if settings.trust_remote_code else [])
    return values


def profile_drafter_values(settings: ServeSettings) -> dict[str, object]:
    """The [drafter] values of a profile for a unit serving `settings`: a model vLLM loads with
    --trust-remote-code (Kimi's config, tokenizer and processor) is one speculators loads the same way."""
    return {"trust_remote_code": settings.trust_remote_code}


def unit_drift(profile: Profile, settings: ServeSettings) -> list[str]:
    """Where the profile says something other than what its unit serves, one line each (empty: none)."""
    s = profile.server
    out = []

    def differ(what: str, ours: object, theirs: object, fix: str) -> None:
        if ours != theirs:
            out.append(f"{what}: the profile says {ours!r}, the unit serves {theirs!r} ({fix})")

    differ("server.model_path", s.model_path, settings.model, "vLLM's --model / `vllm serve MODEL`")
    differ("served model id", s.model_id, settings.served_id,
           "server.served_model_name; without --served-model-name vLLM serves the model path as given")
    differ("server.port", s.port, settings.port, "--port, default 8000")
    differ("server.reasoning_parser", s.reasoning_parser, settings.reasoning_parser, "--reasoning-parser")
    own = read_serve_argv(["vllm", "serve", s.model_path, *s.vllm_args])
    if any(a.split("=", 1)[0] in ("-tp", "--tensor-parallel-size", "--tensor_parallel_size") for a in s.vllm_args):
        differ("tensor parallel size (server.vllm_args)", own.tensor_parallel_size, settings.tensor_parallel_size,
               "--tensor-parallel-size / -tp, default 1")
    if profile.drafter.trust_remote_code != settings.trust_remote_code:
        fix = ("prepare, train and verify load the verifier's own code as vLLM does: set it to true"
               if settings.trust_remote_code else "the unit loads the model without its own code")
        out.append(f"drafter.trust_remote_code: the profile says {str(profile.drafter.trust_remote_code).lower()}, "
                   f"the unit {'passes' if settings.trust_remote_code else 'does not pass'} --trust-remote-code "
                   f"({fix})")
    if profile.gpus.count is not None and profile.gpus.count < settings.tensor_parallel_size:
        out.append(f"gpus.count: the profile says {profile.gpus.count}, the unit's tensor parallel size is "
                   f"{settings.tensor_parallel_size}")
    if settings.config_file:
        out.append(f"the unit reads more options from --config {settings.config_file}: not compared")
    return out
