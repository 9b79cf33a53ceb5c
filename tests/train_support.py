"""Moved to harness/train_support.py (benchmarks share it); kept so `tests.train_support` still names the same module."""
import sys

import harness.train_support

sys.modules[__name__] = harness.train_support
