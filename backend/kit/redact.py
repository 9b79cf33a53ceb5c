"""Command lines as they may be shown or recorded: secrets hidden. A derived server carries the
operator's unit's Environment= as `--setenv=NAME=VALUE` (or `env NAME=VALUE` under tmux) and its ExecStart
as it is, and a unit may hold a secret in either: a secret-looking environment value, a secret option's
value (vLLM's `--api-key KEY` or `--api-key=KEY`, `--hf-token`), or a password inside a URL
(`https://user:password@proxy`). The argv itself keeps every value; only what is shown is redacted."""
from __future__ import annotations

import re
import shlex
from typing import Sequence

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|CREDENTIAL|AUTH", re.IGNORECASE)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# an option whose value is a secret: its name ends in one (`--tokenizer` or `--max-num-batched-tokens`
# do not, nor a rate such as the stand-in's `--latency-per-token`); `--api-key` is vLLM's, `--hf-token`
# huggingface-cli's
_SECRET_OPTION = re.compile(r"--[A-Za-z0-9_-]*(api[-_]?key|(?<!per[-_])token|secret|passw(or)?d|credentials?)",
                            re.IGNORECASE)
# `scheme://user:password@`: the password goes, the user and the host stay (they say which proxy)
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*):[^/@\s]*@")
# a secret option inside one word (an `sh -c` script, a wrapper's single argument)
_INNER_OPTION = re.compile(r"(--[A-Za-z0-9_-]*(?:api[-_]?key|(?<!per[-_])token|secret|passw(?:or)?d|credentials?))"
                           r"([= ]+)([^\s'\"]+)", re.IGNORECASE)
HIDDEN = "***"


def redacted(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
            continue
        if _SECRET_OPTION.fullmatch(a):
            out.append(a)
            hide_next = True
            continue
        option, eq, _ = a.partition("=")
        if eq and _SECRET_OPTION.fullmatch(option):
            out.append(f"{option}={HIDDEN}")
            continue
        prefix = "--setenv=" if a.startswith("--setenv=") else ""
        name, eq, _ = a[len(prefix):].partition("=")
        if eq and _ENV_NAME.fullmatch(name) and SECRET_NAME.search(name):
            out.append(f"{prefix}{name}={HIDDEN}")
            continue
        out.append(redacted_text(a))
    return out


def redacted_text(text: str) -> str:
    """A free text (one word of a command, an Environment= line, a message quoting a command) with the
    secrets it can be seen to hold hidden: URL passwords and secret options' values."""
    text = _URL_PASSWORD.sub(rf"\1:{HIDDEN}@", text)
    return _INNER_OPTION.sub(lambda m: f"{m.group(1)}{m.group(2)}{HIDDEN}", text)


def shown(argv: Sequence[str]) -> str:
    """`argv` as the operator, an event or a summary reads it: shell-quoted, secrets hidden."""
    return shlex.join(redacted(argv))
