"""The plan and command line of a bench of the baseline against the drafter server as one detached host
program (backend/benchpair.py): the bench command lines and the one server switch's plan (switch_plan.py:
the baseline home, the drafter server, and a published drafter in the same unit, away), built here from
the profile. Pure functions, no I/O."""
from __future__ import annotations

from typing import Any

from console.control import drafter_server as ds
from console.control.bench_stage import bench_argv
from console.control.switch_plan import derived_server, switch_plan
from console.control.units import ServerProgram
from console.profile import Profile


def pair_run_ids(run_id: str) -> tuple[str, str, str]:
    """The bench runs of one pair: (the baseline's, the drafter server's, the published drafter's)."""
    return f"{run_id}-baseline", f"{run_id}-drafter", f"{run_id}-third"


def pair_plan(profile: Profile, run_id: str, checkpoint: str, *, input_run: str | None = None,
              api_key_path: str | None = None, no_expand_option: bool = False,
              third_checkpoint: str | None = None, program: ServerProgram | None = None) -> dict[str, Any]:
    """The plan backend/benchpair.py runs (raises DrafterServerError / ValueError with what to fix).
    `third_checkpoint`: a published drafter ([bench].third_drafter, fetched and verified), benched too.
    `program`: the baseline's (operator_unit.read_server_program), which the drafter servers start from."""
    base_id, drafter_id, third_id = pair_run_ids(run_id)
    common = {"input_run": input_run, "api_key_path": api_key_path}
    third: dict[str, Any] = {}
    if third_checkpoint:
        third = {"third_checkpoint": third_checkpoint,
                 "third": {"run_id": third_id, "argv": bench_argv(profile, third_id, label="published",
                                                                  baseline_run=base_id, **common)}}
    drafter_stop = ds.drafter_stop_command(profile).argv
    unit = ds.drafter_unit(profile)

    def drafter(name: str, ckpt: str):
        start = ds.drafter_start_command(profile, ckpt, no_expand_option=no_expand_option, program=program).argv
        return derived_server(profile, name, unit, start, drafter_stop, ds.drafter_command(profile, ckpt, program))

    away = ([drafter("third", third_checkpoint)] if third_checkpoint else []) + [drafter("drafter", checkpoint)]
    return {
        "checkpoint": checkpoint,
        "baseline": {"run_id": base_id, "argv": bench_argv(profile, base_id, label="baseline", **common)},
        "drafter": {"run_id": drafter_id,
                    "argv": bench_argv(profile, drafter_id, label="drafter", baseline_run=base_id,
                                       third_run=third_id if third_checkpoint else None, **common)},
        **third,
        "switch": switch_plan(profile, away).to_dict(),
    }


def pair_argv(profile: Profile, run_id: str, plan_file: str, *, fresh: bool = False) -> list[str]:
    argv = [profile.paths.python, "-m", "backend.benchpair", "--work-dir", profile.paths.work_dir,
            "--run-id", run_id, "--plan", plan_file]
    return argv + (["--fresh"] if fresh else [])
