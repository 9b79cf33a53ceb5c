"""The drafter server, built from the profile: the baseline's own vLLM command line plus
`--speculative-config` (method eagle3, the verified checkpoint, [drafter].num_speculative_tokens draft
tokens per step, [serve_drafter].draft_tensor_parallel_size), run as its own program beside the baseline's name
(`<server unit>-drafter`): a transient systemd unit, or its own tmux session, started and stopped with
the same builders as the stage programs (units.py). Pure functions, no I/O; the caller stops the baseline
first (one server at a time on the GPUs) and starts it again when switching back.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from console.control.units import (HostCommand, server_command, stage_log_path, stage_start_command,
                                   stage_stop_command, tmux_stop_argv)
from console.profile import Profile, check_path

METHOD = "eagle3"
# flags the drafter server sets itself; a baseline command line that has one cannot be extended
_OWN_FLAGS = ("--speculative-config", "--speculative_config")
_TP_FLAGS = ("-tp", "--tensor-parallel-size", "--tensor_parallel_size")


class DrafterServerError(ValueError):
    """The profile cannot give a drafter server; the message says which value and why."""


def drafter_unit(profile: Profile) -> str:
    return f"{profile.server.unit}-drafter"


def drafter_log_path(profile: Profile) -> str:
    return stage_log_path(profile, drafter_unit(profile))


def speculative_config(checkpoint: str, num_speculative_tokens: int, draft_tp: int) -> dict[str, Any]:
    return {"method": METHOD, "model": checkpoint, "num_speculative_tokens": num_speculative_tokens,
            "draft_tensor_parallel_size": draft_tp}


def target_tp(argv: list[str]) -> int:
    """The tensor-parallel size the command line gives the target (vLLM's default 1)."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in _TP_FLAGS:
            text = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                return int(text)
            except ValueError:
                raise DrafterServerError(f"the server's command line has {name} {text!r}: not a number") from None
    return 1


def drafter_command(profile: Profile, checkpoint: str) -> list[str]:
    """The drafter server's command line (see the module docstring)."""
    err = check_path(checkpoint)
    if err:
        raise DrafterServerError(f"drafter checkpoint {checkpoint!r}: expected {err}")
    base = server_command(profile)
    clash = sorted({a.split("=", 1)[0] for a in base if a.split("=", 1)[0] in _OWN_FLAGS})
    if clash:
        raise DrafterServerError(f"the server's command line already has {', '.join(clash)} (server.vllm_args or "
                                 f"server.command): the drafter server adds its own; take it out of the "
                                 f"baseline's arguments")
    draft_tp = profile.serve_drafter.draft_tensor_parallel_size
    tp = target_tp(base)
    if draft_tp not in (1, tp):
        raise DrafterServerError(f"serve_drafter.draft_tensor_parallel_size {draft_tp}: vLLM takes 1 or the "
                                 f"target's tensor-parallel size ({tp})")
    spec = speculative_config(checkpoint, profile.drafter.num_speculative_tokens, draft_tp)
    return base + ["--speculative-config", json.dumps(spec, separators=(",", ":"))]


def drafter_start_command(profile: Profile, checkpoint: str, env: Mapping[str, str] | None = None) -> HostCommand:
    unit = drafter_unit(profile)
    return stage_start_command(profile, unit, drafter_command(profile, checkpoint), log_path=drafter_log_path(profile),
                               cwd=profile.paths.work_dir, env=dict(env or {}))


def drafter_stop_command(profile: Profile) -> HostCommand:
    unit = drafter_unit(profile)
    if profile.server.manager == "systemd":
        return stage_stop_command(profile, unit)
    # a server may take longer than a stage to exit: the profile's own stop timeout, as for the baseline
    argv = tmux_stop_argv(unit, profile.server.stop_timeout_s)
    return HostCommand(argv, f"tmux stop (SIGTERM, then wait) session {unit}")
