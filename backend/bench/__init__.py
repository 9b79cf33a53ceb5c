"""The bench stage: the same workload against a server with and without a drafter, side by side."""
