"""`python -m backend.generate ...`: see backend/generate/config.py for every flag.

Exit codes (backend/contract/exitcodes.py): 0 completed or stopped (SIGTERM), 1 failed (samples failed, disk full,
preflight failed), 2 unusable arguments, dataset or run directory (nothing was started).
"""
from __future__ import annotations

import asyncio
import sys

from backend.contract.runs import RunDirError
from backend.generate.client import read_api_key
from backend.generate.config import ConfigError, parse_config
from backend.generate.runner import Runner
from backend.kit.dataset import DatasetError
from backend.kit.lifecycle import refuse
from backend.kit.secret_files import remove_secret_file, removable_api_key_file


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except (ConfigError, ValueError) as exc:
        if copy := removable_api_key_file(argv):  # refused, but the console's copy goes all the same
            remove_secret_file(copy)
        return refuse("generate", exc)
    try:  # first of all: the copy is gone before the run can be refused (its lock), fail or be stopped
        api_key = read_api_key(config.api_key_env, config.api_key_file, remove=config.remove_api_key_file)
    except ValueError as exc:
        return refuse("generate", exc)
    try:
        return asyncio.run(Runner(config, api_key=api_key).run())
    except (DatasetError, RunDirError) as exc:
        return refuse("generate", exc)


if __name__ == "__main__":
    sys.exit(main())
