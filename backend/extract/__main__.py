"""`python -m backend.extract ...`: see backend/extract/config.py for every flag.

Exit codes (backend/contract/exitcodes.py): 0 completed or stopped (SIGTERM; with a plan the baseline is back), 1 failed (the finish event
and summary say why; with a plan the baseline is back), 2 a failed preflight or unusable arguments: one
line per failed check on stderr, nothing created, the baseline never touched. `--preflight-only` prints
the checks and the disk estimate as JSON and exits 0 (all pass) or 1.
"""
from __future__ import annotations

import asyncio
import json
import sys

from backend.contract import exitcodes
from backend.contract.runs import RunDirError
from backend.extract.config import ConfigError, parse_config
from backend.kit.lifecycle import refuse
from backend.kit.preflight import offline_env


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        return refuse("extract", exc)
    offline_env()
    from backend.extract.runner import ExtractRunner, preflight

    try:
        report, inputs = preflight(config)
        if config.preflight_only:
            out = report.to_dict()
            out["estimate"] = inputs.estimate.to_dict() if inputs and inputs.estimate else None
            print(json.dumps(out, indent=2))
            return exitcodes.COMPLETED if report.ok else exitcodes.FAILED
        if not report.ok or inputs is None:
            for check in report.checks:
                if not check.ok:
                    print(f"extract: {check.name}: {check.detail}" + (f" -> {check.fix}" if check.fix else ""),
                          file=sys.stderr)
            return exitcodes.BAD_INPUT
        for warning in report.warnings():  # the host's integrity: said in the run's log, never a refusal
            print(f"extract: warning: {warning}", file=sys.stderr)
        return asyncio.run(ExtractRunner(config, inputs).run())
    except RunDirError as exc:
        return refuse("extract", exc)


if __name__ == "__main__":
    sys.exit(main())
