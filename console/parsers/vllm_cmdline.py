"""What a `vllm serve` command line (an operator's unit's ExecStart) serves, as vLLM itself derives it:
the model, the served id, the port, the tensor-parallel size and the reasoning parser. Pure functions.

vLLM 0.33 (see ../shared/notes/vllm-surface.md, "The operator's unit"): `vllm serve [model_tag]` (the
positional wins over --model), `--served-model-name` takes one or more names and the first is the id
(/v1/models lists it first); without it the id is the model as given (config/model.py
get_served_model_name); --port defaults to 8000, --tensor-parallel-size (-tp) to 1; its parser accepts
`_` for `-` in option names and `--opt=value`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

DEFAULT_PORT = 8000
_VALUE_FLAGS = {"--model", "--port", "--tensor-parallel-size", "--reasoning-parser", "--host", "--config"}
_TP_ALIASES = {"-tp": "--tensor-parallel-size"}
_API_SERVER = "vllm.entrypoints.openai.api_server"


class CmdlineError(ValueError):
    """The command line is not one this reader can derive a server from; the message says why."""


@dataclass(frozen=True)
class ServeSettings:
    model: str
    served_model_names: tuple[str, ...]
    port: int
    tensor_parallel_size: int
    reasoning_parser: str | None
    trust_remote_code: bool
    config_file: str | None  # `--config FILE`: values there are not read here

    @property
    def served_id(self) -> str:
        return self.served_model_names[0] if self.served_model_names else self.model


def _normal(flag: str) -> str:
    if flag.startswith("--"):
        return "--" + flag[2:].replace("_", "-")
    return _TP_ALIASES.get(flag, flag)


def serve_args(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """The arguments vLLM's parser sees (after `vllm serve`, or `python -m vllm.entrypoints.openai.api_server`)
    and the positional model_tag (None when the first argument is an option)."""
    for i, arg in enumerate(argv):
        if i + 1 < len(argv) and os.path.basename(arg) == "vllm" and argv[i + 1] == "serve":
            rest = list(argv[i + 2:])
            if rest and not rest[0].startswith("-"):
                return rest[1:], rest[0]
            return rest, None
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] == _API_SERVER:
            return list(argv[i + 2:]), None
    raise CmdlineError("not a vLLM server command line: expected `vllm serve ...` or "
                       f"`python -m {_API_SERVER} ...`")


_CLI_MAIN = "vllm.entrypoints.cli.main"


def server_python(argv: Sequence[str]) -> str | None:
    """The interpreter a server command line runs vLLM with (`PY -m vllm.entrypoints.openai.api_server ...`,
    `PY -m vllm.entrypoints.cli.main serve ...`, possibly after `env NAME=VALUE`): the bench runs
    `vllm bench serve` through it, the served vLLM's own (vLLM's CPU build has no working `vllm` script).
    None for `vllm serve ...` (the CLI is on PATH) or a word the host would still expand (`$VAR`, `~`)."""
    for i, arg in enumerate(argv):
        if arg == "-m" and 0 < i and i + 1 < len(argv) and argv[i + 1] in (_API_SERVER, _CLI_MAIN):
            python = argv[i - 1]
            name = os.path.basename(python)
            if name.startswith("python") and "=" not in python and not python.startswith(("$", "~")) \
                    and "$" not in python:
                return python
            return None
    return None


def read_serve_argv(argv: Sequence[str]) -> ServeSettings:
    args, model_tag = serve_args(argv)
    values: dict[str, str] = {}
    names: list[str] = []
    trust = False
    i = 0
    while i < len(args):
        raw = args[i]
        flag, eq, inline = raw.partition("=") if raw.startswith("--") else (raw, "", "")
        flag = _normal(flag)
        if flag == "--served-model-name":  # nargs="+": every word up to the next option
            if eq:
                names = [inline]
            else:
                names = []
                while i + 1 < len(args) and not args[i + 1].startswith("-"):
                    names.append(args[i + 1])
                    i += 1
                if not names:
                    raise CmdlineError("--served-model-name without a name")
        elif flag in _VALUE_FLAGS:
            if eq:
                values[flag] = inline
            elif i + 1 < len(args):
                values[flag] = args[i + 1]
                i += 1
            else:
                raise CmdlineError(f"{flag} without a value")
        elif flag == "--trust-remote-code":
            trust = True
        elif flag == "--no-trust-remote-code":
            trust = False
        i += 1
    model = model_tag or values.get("--model")
    if not model:
        raise CmdlineError("no model: neither `vllm serve MODEL` nor --model on the command line")
    try:
        port = int(values.get("--port", DEFAULT_PORT))
        tp = int(values.get("--tensor-parallel-size", 1))
    except ValueError:
        raise CmdlineError(f"--port {values.get('--port')!r} / --tensor-parallel-size "
                           f"{values.get('--tensor-parallel-size')!r}: expected integers") from None
    return ServeSettings(model=model, served_model_names=tuple(names), port=port, tensor_parallel_size=tp,
                         reasoning_parser=values.get("--reasoning-parser") or None, trust_remote_code=trust,
                         config_file=values.get("--config"))
