"""The extract stage: the verifier's hidden states for every prepared row (see runner.py)."""
