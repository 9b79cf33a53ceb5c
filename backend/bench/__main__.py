"""`python -m backend.bench ...`: see backend/bench/runner.py.

Exit codes (backend/contract/exitcodes.py): 0 completed (or stopped by SIGTERM), 1 failed (the server did not
answer, every request of a level failed, vllm bench serve failed, --self-test read back another acceptance
than the one set or none), 2 bad input (nothing created), 3
completed but slower than the --baseline-run it was compared with (a drafter that does not pay).
"""
from __future__ import annotations

import sys

from backend.bench.config import ConfigError, parse_config
from backend.bench.runner import main as run
from backend.kit.lifecycle import refuse
from backend.kit.secret_files import read_secret_file, remove_secret_file, removable_api_key_file


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        if copy := removable_api_key_file(argv):  # refused, but the console's copy goes all the same
            remove_secret_file(copy)
        return refuse("bench", exc)
    try:  # first of all: the copy is gone before the run can be refused (its lock), fail or be stopped
        api_key = read_secret_file(config.api_key_file, "--api-key-file", remove=config.remove_api_key_file) \
            if config.api_key_file else None
    except ValueError as exc:
        return refuse("bench", exc)
    return run(config, api_key)


if __name__ == "__main__":
    sys.exit(main())
