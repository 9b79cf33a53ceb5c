"""The train stage: speculators EAGLE-3 training as a host-side stage program (see runner.py)."""
