"""The prepare stage: a generation run's output -> speculators' prepared datasets (see runner.py)."""
