"""Moved to harness/drafter_support.py (benchmarks share it); kept so `tests.drafter_support` still names the same module."""
import sys

import harness.drafter_support

sys.modules[__name__] = harness.drafter_support
