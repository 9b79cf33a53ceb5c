"""Moved to harness/fake_controller.py (benchmarks share it); kept so `tests.fake_controller` still names the same module."""
import sys

import harness.fake_controller

sys.modules[__name__] = harness.fake_controller
