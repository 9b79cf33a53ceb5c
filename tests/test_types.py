"""The type check: mypy over console/, backend/ and the test fake, as configured in pyproject.toml
([tool.mypy]). Above all it holds Session and FakeController to the Controller Protocol the app is
written against (their `_conforms` functions), so a method only one of them has fails here."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(600)


def test_mypy_is_clean(tmp_path_factory):
    # a cache outside the checkout, kept across runs of one machine: a warm run takes seconds
    cache = Path(os.environ.get("MYPY_CACHE_DIR") or tmp_path_factory.getbasetemp().parent / "mypy-cache")
    res = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)], cwd=REPO,
                         capture_output=True, text=True, timeout=580)
    assert res.returncode == 0, res.stdout[-8000:] + res.stderr[-2000:]
