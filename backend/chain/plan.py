"""The chain's plan file: which stage programs to run, in order (the one definition of its format).

    {"stages": [{"stage": "prepare", "run_id": "night-prepare",
                 "argv": ["python3", "-m", "backend.prepare", "--work-dir", ...],
                 "env": {"PYTHONPATH": "..."}}, ...],
     "lock_path": "/w/state/servers.lock",                    (optional: some stage switches servers)
     "hold": {"from": "extract", "to": "verify", "switch": {...}}}   (optional, backend/kit/gpu_owners.py)

`lock_path`: the chain takes the host's server lock (backend/kit/serverlock.py) for its whole run and hands
it to its stages. `hold`: the baseline is stopped (with the one server switch, backend/kit/switch.py) before
stage `from` and started again after stage `to`, or as soon as the chain ends early; the stages between
run with E3_BASELINE_HELD=1 and leave it down.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.contract import stages as host_stages
from backend.contract.plans import PlanError, argv_list, read_plan
from backend.contract.runs import RunDirError, check_run_id
from backend.kit.switch import SwitchPlan, SwitchPlanError, switch_from_dict

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
    pipeline = host_stages.pipeline()
    out: list[PlannedStage] = []
    for i, entry in enumerate(data["stages"]):
        where = f"{source}: stages[{i}]"
        if not isinstance(entry, dict):
            raise PlanError(f"{where}: expected an object")
        stage, run_id, argv, env = entry.get("stage"), entry.get("run_id"), entry.get("argv"), entry.get("env", {})
        if stage not in pipeline:
            raise PlanError(f"{where}.stage: expected one of {', '.join(pipeline)}, got {stage!r}")
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
    order = [pipeline.index(p.stage) for p in out]
    if order != sorted(order):
        raise PlanError(f"{source}: stages out of pipeline order ({', '.join(p.stage for p in out)})")
    return out


@dataclass(frozen=True)
class Hold:
    """The baseline kept down from stage `first` through stage `last`, stopped and started by `switch`."""
    first: str
    last: str
    switch: SwitchPlan

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.first, "to": self.last, "switch": self.switch.to_dict()}


@dataclass(frozen=True)
class ChainPlan:
    stages: list[PlannedStage]
    lock_path: str = ""
    hold: Hold | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stages": [s.to_dict() for s in self.stages]}
        if self.lock_path:
            out["lock_path"] = self.lock_path
        if self.hold is not None:
            out["hold"] = self.hold.to_dict()
        return out


def parse_chain(data: Any, source: str = "plan") -> ChainPlan:
    stages = parse_plan(data, source)
    lock = data.get("lock_path") or ""
    if not isinstance(lock, str) or (lock and not lock.startswith("/")):
        raise PlanError(f"{source}: lock_path: expected an absolute path, got {lock!r}")
    hold = None
    if data.get("hold") is not None:
        h = data["hold"]
        names = [p.stage for p in stages]
        if not isinstance(h, dict) or h.get("from") not in names or h.get("to") not in names \
                or names.index(h["from"]) > names.index(h["to"]):
            raise PlanError(f"{source}: hold: expected {{\"from\": STAGE, \"to\": STAGE, \"switch\": ...}} with "
                            f"two of the plan's stages in order ({', '.join(names)})")
        try:
            switch = switch_from_dict(h.get("switch"), f"{source}: hold.switch")
        except SwitchPlanError as exc:
            raise PlanError(str(exc)) from None
        hold = Hold(h["from"], h["to"], switch)
        lock = lock or switch.lock_path
    return ChainPlan(stages, lock, hold)


def load_chain(path: str) -> ChainPlan:
    return parse_chain(read_plan(path), path)


def load_plan(path: str) -> list[PlannedStage]:
    return load_chain(path).stages


def dumps_plan(stages: "list[PlannedStage] | ChainPlan") -> str:
    plan = stages if isinstance(stages, ChainPlan) else ChainPlan(list(stages))
    return json.dumps(plan.to_dict(), indent=2)
