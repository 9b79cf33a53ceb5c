"""Command lines as they may be shown or recorded: the values of secret-looking environment assignments
hidden. A derived server carries the operator's unit's Environment= as `--setenv=NAME=VALUE` (or
`env NAME=VALUE` under tmux), and a unit may hold a token there; the argv itself keeps the value."""
from __future__ import annotations

import re
from typing import Sequence

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|AUTH", re.IGNORECASE)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def redacted(argv: Sequence[str]) -> list[str]:
    out = []
    for a in argv:
        prefix = "--setenv=" if a.startswith("--setenv=") else ""
        name, eq, _ = a[len(prefix):].partition("=")
        secret = eq and _ENV_NAME.fullmatch(name) and SECRET_NAME.search(name)
        out.append(f"{prefix}{name}=***" if secret else a)
    return out
