"""`python -m backend.prepare ...`: see backend/prepare/config.py for every flag.

Exit codes (backend/contract/exitcodes.py): 0 completed or stopped (SIGTERM), 1 failed (the finish event and summary say why), 2 unusable
arguments or input (a generation run that is not complete, a verifier not on this host, a run directory
holding another run): one line on stderr, nothing created or changed.
"""
from __future__ import annotations

import importlib.util
import os
import sys

from backend.contract.runs import RunDirError, run_path
from backend.kit.lifecycle import refuse
from backend.kit.preflight import offline_env
from backend.kit.verifier import VerifierError
from backend.prepare.config import ConfigError, parse_config

REQUIRED_MODULES = ("speculators", "datasets", "httpx")


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
        offline_env(os.path.join(run_path(config.work_dir, config.run_id), "rows", "hf-cache"))
        missing = [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            return refuse("prepare", f"{sys.executable} lacks {', '.join(missing)}: install them with "
                          f"{sys.executable} -m pip install {' '.join(missing)}")
        from backend.prepare.runner import PrepareRunner, resolve_inputs
        inputs = resolve_inputs(config)
        return PrepareRunner(config).run(inputs)
    except (ConfigError, RunDirError, VerifierError) as exc:
        return refuse("prepare", exc)


if __name__ == "__main__":
    sys.exit(main())
