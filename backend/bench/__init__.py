"""The bench stage: the same workload against a server with and without a drafter, side by side."""

STAGE = "bench"  # its run directories' stage (the bench pair, backend/benchpair.py, checks its benches by it)
# The bench pair's own run directories (backend/benchpair.py): a name of its own, so the console never
# takes one of the pair's benches (stage "bench", run ids R-baseline, R-drafter) for the pair itself
PAIR_STAGE = "bench_pair"
