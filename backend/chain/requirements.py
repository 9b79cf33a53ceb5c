"""What every stage of a plan needs from this host, checked before the chain's first stage starts.

Each stage program checks its own needs when it starts; in a chain that is hours after the first stage
began (a generation run of a real host takes hours), so a host lacking speculators would fail at prepare
after the whole generation. These checks are the cheap ones (no server, no weights): the python modules
of each stage's interpreter, the verifier directory each stage names, and the room the training
checkpoints take on the work dir's volume. A stage already completed (a resumed chain) is not checked.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from backend.chain.plan import PlannedStage
from backend.contract import stages as host_stages
from backend.kit.preflight import free_bytes, human_bytes
from backend.kit.verifier import VerifierError, VerifierInfo, read_verifier


def install_hint(extra: str) -> str:
    return f"pip install 'eagle3-console[{extra}]'"


def stage_modules(stage: str) -> tuple[str, ...]:
    """The modules the stage's program imports: the one list lives with that stage's own check, and its
    row (backend/contract/stages.py) says where."""
    where = host_stages.get(stage).modules
    if where is None:
        return ()
    module, _, name = where.partition(":")
    return tuple(getattr(importlib.import_module(module), name))


MODULE_CHECK_TIMEOUT_S = 60
_FIND = "import importlib.util, json, sys; print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))"


@dataclass(frozen=True)
class Problem:
    stage: str
    what: str  # python_modules, verifier, disk_space
    detail: str

    def line(self) -> str:
        return f"{self.stage}: {self.detail}"


def missing_modules(python: str, modules: tuple[str, ...]) -> list[str]:
    """The modules `python` cannot find (asked of that interpreter: a stage may run another python)."""
    # not realpath: a venv's python is a symlink to the base interpreter but has its own site-packages
    if os.path.abspath(_which(python) or python) == os.path.abspath(sys.executable):
        return [m for m in modules if importlib.util.find_spec(m) is None]
    try:
        res = subprocess.run([python, "-c", _FIND, *modules], capture_output=True, text=True,
                             timeout=MODULE_CHECK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"(python {python} did not answer: {exc})"]
    try:
        found = json.loads(res.stdout.strip().splitlines()[-1])
        return [str(m) for m in found]
    except (ValueError, IndexError):
        return [f"(python {python} did not answer: exit {res.returncode})"]


def _which(name: str) -> str | None:
    import shutil
    return shutil.which(name)


def _flag(argv: tuple[str, ...], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def train_checkpoint_bytes(argv: tuple[str, ...], info: VerifierInfo) -> int | None:
    """The train stage's own checkpoint estimate, from its own arguments; None if they do not parse
    (the stage then says why when it starts)."""
    try:
        from backend.train.config import parse_config
        from backend.train.runner import estimate_checkpoint_bytes
        config = parse_config(list(argv[argv.index("backend.train") + 1:]))
    except (ValueError, SystemExit, ImportError):  # ConfigError is a ValueError
        return None
    layers = len(config.aux_layer_ids) if config.aux_layer_ids else 3  # vLLM's default: three
    return estimate_checkpoint_bytes(config, info, layers)


def check_plan(work_dir: str, stages: list[PlannedStage]) -> list[Problem]:
    problems: list[Problem] = []
    by_python: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for planned in stages:
        python = planned.argv[0]
        modules = stage_modules(planned.stage)
        key = (python, modules)
        if key not in by_python:
            by_python[key] = missing_modules(python, modules)
        if by_python[key]:
            hint = install_hint(host_stages.get(planned.stage).extra)
            problems.append(Problem(planned.stage, "python_modules",
                                    f"{python} lacks {', '.join(by_python[key])}: install them with "
                                    f"{python} -m {hint}"))
        verifier = _flag(planned.argv, "--verifier")
        if verifier is None:
            continue
        try:
            info = read_verifier(verifier)
        except VerifierError as exc:
            problems.append(Problem(planned.stage, "verifier", str(exc)))
            continue
        if planned.stage == "train":
            need = train_checkpoint_bytes(planned.argv, info)
            free = free_bytes(work_dir)
            if need is not None and free < need:
                problems.append(Problem(planned.stage, "disk_space",
                                        f"{human_bytes(free)} free on the volume of {work_dir}; the training "
                                        f"checkpoints need about {human_bytes(need)}"))
    return problems
