"""Moved to harness/sim_support.py (benchmarks share it); kept so `tests.sim_support` still names the same module."""
import sys

import harness.sim_support

sys.modules[__name__] = harness.sim_support
