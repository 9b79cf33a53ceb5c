"""The verify stage: the checkpoint as vLLM will load it, and offline acceptance (see runner.py)."""
