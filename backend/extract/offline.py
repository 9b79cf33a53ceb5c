"""`python -m backend.extract.offline`: speculators' generate-offline-data for each (dataset, output) pair.

The extract stage runs this as its child, so one interpreter start (speculators, torch, datasets: seconds)
serves both the training and the held-out rows, and a stop is a signal to one process. It calls the CLI
command's own function, with the CLI's behaviour: files already present are kept (a rerun resumes),
unreadable ones are redone, failed samples are skipped and logged, and a server that stops answering
aborts the run. Exit 1 when a pair fails, 130 on SIGINT (the stage's stop).

With `--wait-for-go` it imports first and then waits for a line on stdin: the stage starts it while the
extraction server is still loading, so the imports overlap the load; `go` starts the work, anything else
(or end of input: the stage gave up) exits 0 having done nothing.
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.extract.offline")
    p.add_argument("--endpoint", required=True, help="the extraction server's OpenAI base URL (with /v1)")
    p.add_argument("--pair", nargs=2, action="append", required=True, metavar=("DATASET", "OUTPUT"))
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--max-retries", type=int, default=2)
    p.add_argument("--max-consecutive-errors", type=int)
    p.add_argument("--validate-outputs", action="store_true")
    p.add_argument("--wait-for-go", action="store_true")
    ns = p.parse_args(argv)
    from speculators.cli.generate_offline_data import generate_offline_data

    if ns.wait_for_go and sys.stdin.readline().strip() != "go":
        return 0

    for dataset, output in ns.pair:
        print(f"extract.offline: {dataset} -> {output}", flush=True)
        generate_offline_data(model=None, endpoint=ns.endpoint, preprocessed_data=dataset, max_samples=None,
                              output=output, concurrency=ns.concurrency, validate_outputs=ns.validate_outputs,
                              request_timeout=ns.request_timeout, max_retries=ns.max_retries,
                              fail_on_error=False, max_consecutive_errors=ns.max_consecutive_errors,
                              world_size=1, rank=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
