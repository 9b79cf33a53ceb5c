"""The console's version, read from the installed distribution's metadata (pyproject.toml sets it once)."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "eagle3-console"


def package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # imported from a checkout that was never pip-installed
        return "unknown (not installed)"
