"""The bench stage: the same workload against a server with and without a drafter, side by side."""
# STAGE: its run directories' stage (the bench pair, backend/benchpair.py, checks its benches by it);
# PAIR_STAGE: the bench pair's own run directories' stage (backend/contract/stages.py says why it differs)
from backend.contract.stages import BENCH as STAGE, BENCH_PAIR as PAIR_STAGE  # noqa: F401
