"""How the console names what it runs on the host: units (systemd) and sessions (tmux), and their logs.

One module below both control (which starts and stops them) and telemetry (which watches them), so the
two always agree on a name and neither imports the other. Pure functions of the profile.
"""
from __future__ import annotations

from typing import Iterable

from backend.bench import PAIR_STAGE, STAGE as BENCH_STAGE
from backend.contract.runs import RUN_ID_PATTERN, stage_unit_name  # noqa: F401 - the one definition, the host's too
from console.profile import Profile, check_unit

# A pipeline run's stages run in its own unit, the chain's (their events name it)
CHAIN_STAGE = "pipeline"
# The console starts the bench pair (its runs: PAIR_STAGE) as its bench stage, in a "bench" unit, and the
# pair's benches run in that unit too
UNIT_STAGE = {PAIR_STAGE: BENCH_STAGE}

# Which server: the baseline (the profile's own unit) or the drafter server (its `-drafter` unit).
SERVERS = ("baseline", "drafter")


def unit_stages(run_stage: str) -> tuple[str, ...]:
    """The stages whose units a run of `run_stage` (its events' stage) may run in: its own (or the one the
    console starts it as) and the chain's."""
    return (UNIT_STAGE.get(run_stage, run_stage), CHAIN_STAGE)


def is_stage_unit(name: object, stages: Iterable[str]) -> bool:
    """Whether `name` is `stage_unit_name` of one of `stages` and a valid run id, whole (and a valid unit
    name): the only units a run's events may name as the one it runs in."""
    if not isinstance(name, str) or not name.startswith("e3-") or check_unit(name):
        return False
    for stage in stages:
        prefix = stage_unit_name(stage, "")
        if name.startswith(prefix) and RUN_ID_PATTERN.fullmatch(name[len(prefix):]):
            return True
    return False


def server_log_path(profile: Profile) -> str:
    """Where the tmux manager's server writes its output."""
    return f"{profile.paths.work_dir}/logs/{profile.server.unit}.log"


def stage_log_path(profile: Profile, unit: str) -> str:
    """tmux manager: a stage's output (kept out of the run dir, which the stage alone owns)."""
    return f"{profile.paths.work_dir}/logs/{unit}.log"


def exit_status_path(log_path: str) -> str:
    """Where the tmux wrapper records the program's exit status (tmux's own is not always there)."""
    return f"{log_path}.exit"


def tmux_target(session: str) -> str:
    """The exact target of a session's current window for list-panes and kill-session: `=NAME:`. A bare
    `=NAME` that matches no session falls back to a prefix match as a window target (tmux 3.3a:
    `list-panes -t =vllm` lists the panes of `vllm-drafter` when `vllm` is gone), so a stop would kill,
    and a probe would report, another program's session."""
    return f"={session}:"


def drafter_unit(profile: Profile) -> str:
    return f"{profile.server.unit}-drafter"


def drafter_log_path(profile: Profile) -> str:
    return stage_log_path(profile, drafter_unit(profile))


def server_unit(profile: Profile, which: str) -> str:
    return drafter_unit(profile) if which == "drafter" else profile.server.unit


def server_log(profile: Profile, which: str) -> str:
    """tmux manager: where that server writes its output."""
    return drafter_log_path(profile) if which == "drafter" else server_log_path(profile)
