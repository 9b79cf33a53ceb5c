"""Plan files: what the console hands a host program to run (the chain's stages, the extraction swap, the
bench pair). One error type and one check of a command line, for every plan.

A plan's commands are argument lists, never shell strings: nothing here parses a shell.
"""
from __future__ import annotations

from typing import Any

from backend.contract.runs import read_json_object


class PlanError(ValueError):
    """The plan file is unusable; the message names the file, the key and what was expected."""


def read_plan(path: str) -> dict[str, Any]:
    return read_json_object(path, PlanError, f"{path}: no such plan file")


def argv_list(value: Any, where: str, *, required: bool = True) -> list[str] | None:
    """`value` as a command line (a non-empty list of strings without NUL), or PlanError naming `where`."""
    if value is None and not required:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise PlanError(f"{where} must be a non-empty list of strings (a command line), got {str(value)[:80]}")
    return list(value)
