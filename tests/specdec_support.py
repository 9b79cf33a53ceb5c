"""Moved to harness/specdec_support.py (benchmarks share it); kept so `tests.specdec_support` still names the same module."""
import sys

import harness.specdec_support

sys.modules[__name__] = harness.specdec_support
