"""The snapshot model moved to console/snapshot.py (the bottom layer: parsers build its records).
This name is kept so code written against the old path still imports; new code imports console.snapshot."""
from console.snapshot import *  # noqa: F401,F403
