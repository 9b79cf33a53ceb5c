"""Host text the headless commands print goes through console/parsers/text.py first: a unit Id, a model
path or a command line with terminal escapes never reaches the operator's terminal raw."""
from __future__ import annotations

import argparse
import asyncio

from console.commands import profile_cmd, run_cmd
from console.control.operator_unit import unit_settings
from console.control.units import ServerProgram
from console.session import ActionResult

ESC = "\x1b]0;pwned\x07\x1b[2J"


def test_profile_init_from_unit_prints_the_units_id_cleaned(monkeypatch, capsys, tmp_path):
    # the Id as a hostile systemd answer would name it: reading it for real needs the systemd rig, whose
    # units are named by us; the reader is replaced here, the printing is the command's own
    program = ServerProgram(("vllm", "serve", "/m", "--served-model-name", "kimi"),
                            source=f"unit vllm{ESC}.service", note=f"a note{ESC}")
    monkeypatch.setattr(profile_cmd, "read_unit_settings", lambda probe: (program, unit_settings(program), "root", None))
    from console.cli import main

    assert main(["profile", "init", str(tmp_path / "p.toml"), "--host", "gpu-host.example", "--from-unit", "vllm",
                 "--work-dir", "/data/e3"]) == 0
    out = capsys.readouterr().out
    assert "read unit" in out and "\x1b" not in out and "\x07" not in out
    # a model path the profile refuses is quoted in the error: cleaned too
    hostile = ServerProgram(("vllm", "serve", f"/m{ESC}"), source="unit vllm.service")
    monkeypatch.setattr(profile_cmd, "read_unit_settings", lambda probe: (hostile, unit_settings(hostile), "root", None))
    assert main(["profile", "init", str(tmp_path / "q.toml"), "--host", "gpu-host.example", "--from-unit", "vllm",
                 "--work-dir", "/data/e3"]) == 2
    err = capsys.readouterr().err
    assert "server.model_path" in err and "\x1b" not in err and "\x07" not in err


def test_run_serve_prints_the_switchs_commands_cleaned(monkeypatch, capsys):
    class Switching:  # the session's answer as a unit with an escape in its ExecStart makes it
        def __init__(self, *args, **kwargs) -> None:
            pass

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc) -> None:
            return None

        async def settle(self):
            return argparse.Namespace(host=argparse.Namespace(reachable=True, error=None))

        def downtime(self, stage: str) -> str:
            return "nothing"

        async def serve_baseline(self) -> ActionResult:
            return ActionResult(False, f"failed{ESC}", (f"systemctl start vllm{ESC}",))

    monkeypatch.setattr(run_cmd, "Session", Switching)
    ns = argparse.Namespace(stage="serve-baseline", interval=1.0, yes=True, wait=False, input_run=None)
    assert asyncio.run(run_cmd.switch_server(ns, argparse.Namespace())) == 1
    err = capsys.readouterr().err
    assert "systemctl start vllm" in err and "\x1b" not in err and "\x07" not in err
