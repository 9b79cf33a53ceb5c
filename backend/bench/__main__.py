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


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        return refuse("bench", exc)
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
