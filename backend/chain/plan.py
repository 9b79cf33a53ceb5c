"""The chain's plan file: which stage programs to run, in order (the one definition of its format).

    {"stages": [{"stage": "prepare", "run_id": "night-prepare",
                 "argv": ["python3", "-m", "backend.prepare", "--work-dir", ...],
                 "env": {"PYTHONPATH": "..."}}, ...]}
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.lookup import STAGES
from backend.plans import PlanError, argv_list, read_plan
from backend.runs import RunDirError, check_run_id

PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class PlannedStage:
    stage: str
    run_id: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["argv"] = list(self.argv)
        return d


def chain_stage_run_id(chain_id: str, stage: str) -> str:
    """Each stage of a pipeline run has a run of its own, named after the chain."""
    return check_run_id(f"{chain_id}-{stage}")


def parse_plan(data: Any, source: str = "plan") -> list[PlannedStage]:
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list) or not data["stages"]:
        raise PlanError(f"{source}: expected an object with a non-empty list `stages`")
    out: list[PlannedStage] = []
    for i, entry in enumerate(data["stages"]):
        where = f"{source}: stages[{i}]"
        if not isinstance(entry, dict):
            raise PlanError(f"{where}: expected an object")
        stage, run_id, argv, env = entry.get("stage"), entry.get("run_id"), entry.get("argv"), entry.get("env", {})
        if stage not in STAGES:
            raise PlanError(f"{where}.stage: expected one of {', '.join(STAGES)}, got {stage!r}")
        try:
            check_run_id(run_id)
        except RunDirError as exc:
            raise PlanError(f"{where}.run_id: {exc}") from None
        argv = argv_list(argv, f"{where}.argv")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise PlanError(f"{where}.env: expected an object of strings")
        if any(p.stage == stage for p in out):
            raise PlanError(f"{where}.stage: {stage} appears twice")
        out.append(PlannedStage(stage, run_id, tuple(argv), dict(env)))
    order = [STAGES.index(p.stage) for p in out]
    if order != sorted(order):
        raise PlanError(f"{source}: stages out of pipeline order ({', '.join(p.stage for p in out)})")
    return out


def load_plan(path: str) -> list[PlannedStage]:
    return parse_plan(read_plan(path), path)


def dumps_plan(stages: list[PlannedStage]) -> str:
    return json.dumps({"stages": [s.to_dict() for s in stages]}, indent=2)
