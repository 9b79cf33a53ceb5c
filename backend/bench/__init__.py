"""The bench stage: the same workload against a server with and without a drafter, side by side."""

STAGE = "bench"  # its run directories' stage (the bench pair, backend/benchpair.py, checks its benches by it)
