"""The baseline server's command line as the profile states it: a pure function of the profile, below the
stage table, the units and the GPU plan (all three read it; none of them may be imported by it)."""
from __future__ import annotations

from backend.kit.gpu_owners import parallel_error
from console.profile import Profile


_TP_FLAGS = ("-tp", "--tensor-parallel-size", "--tensor_parallel_size")


class ServerArgvError(ValueError):
    """The server's command line says something the console cannot read; the message says what."""


def server_command(profile: Profile) -> list[str]:
    s = profile.server
    if s.command:
        return list(s.command)
    argv = ["vllm", "serve", s.model_path, "--host", "127.0.0.1", "--port", str(s.port)]
    if s.served_model_name:
        argv += ["--served-model-name", s.served_model_name]
    if s.reasoning_parser and "--reasoning-parser" not in s.vllm_args:
        argv += ["--reasoning-parser", s.reasoning_parser]
    return argv + list(s.vllm_args)


def target_tp(argv: list[str]) -> int:
    """The tensor-parallel size the command line gives the target (vLLM's default 1)."""
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in _TP_FLAGS:
            text = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                tp = int(text)
            except ValueError:
                raise ServerArgvError(f"the server's command line has {name} {text!r}: not a number") from None
            error = parallel_error(tp)
            if error:
                raise ServerArgvError(f"the server's command line has {name} {text!r}: {error}")
            return tp
    return 1
