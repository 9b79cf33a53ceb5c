"""`python -m backend.train ...`: see backend/train/config.py for every flag.

Exit codes (backend/contract/exitcodes.py): 0 completed or stopped (SIGTERM: a resumable checkpoint was saved; the same command
resumes), 1 failed (training error, preflight failed), 2 unusable arguments, input run, verifier or run
directory (nothing was started and nothing was changed).
"""
from __future__ import annotations

import os
import sys

from backend.kit.lifecycle import refuse
from backend.train.config import ConfigError, parse_config


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        return refuse("train", exc)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if config.gpu_ids:
        # before torch is imported: it counts, and numbers from 0, only the GPUs it is given
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, config.gpu_ids))
        config.gpus = len(config.gpu_ids)
    from backend.train.runner import Stage

    return Stage(config).run()


if __name__ == "__main__":
    sys.exit(main())
