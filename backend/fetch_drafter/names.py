"""What a Hugging Face repo id and revision may be: one definition for the profile and the stage.

Stricter than the Hub's own rule (`validate_repo_id`): ASCII only and always `owner/name`, so a value
that passes is safe in a path component (`owner--name`), a URL and a command line.
"""
from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
REPO_ID_PATTERN = re.compile(rf"{_PART}/{_PART}")
# a branch, tag or commit; `refs/pr/N` style names hold slashes
REVISION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


def repo_id_problem(value: str) -> str | None:
    """None when `value` is a usable repo id; else what was expected."""
    expected = ("a Hugging Face model id as owner/name (letters, digits, '-', '_', '.'; each part at most "
                "96 characters, starting with a letter or digit)")
    if not isinstance(value, str) or not REPO_ID_PATTERN.fullmatch(value):
        return expected
    if ".." in value or "--" in value or value.endswith(".git"):
        return expected + ", without '..', '--' or a trailing '.git'"
    return None


def revision_problem(value: str) -> str | None:
    if (not isinstance(value, str) or not REVISION_PATTERN.fullmatch(value) or ".." in value
            or "//" in value or value.endswith("/")):
        return "a branch, tag or commit such as main or a 40-digit commit hash"
    return None


def folder_name(repo_id: str) -> str:
    """The repo's directory name on the host (the Hub cache's own convention: owner--name)."""
    return repo_id.replace("/", "--")


def endpoint_problem(url: str) -> str | None:
    """None when the Hub endpoint `url` may be used: https, or plain http to this machine only (a test
    stand-in); plain http anywhere else would carry the token and the weights in clear."""
    expected = "an https URL such as https://huggingface.co (plain http only to a loopback address)"
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return expected
    if parts.scheme == "https" and host:
        return None
    if parts.scheme != "http":
        return expected
    if host == "localhost":
        return None
    try:
        return None if ipaddress.ip_address(host).is_loopback else expected
    except ValueError:
        return expected
