"""A profile read from, and compared with, the operator's unit: what a `vllm serve` command line serves as
vLLM derives it (console/parsers/vllm_cmdline.py) and the drift `profile check` reports. Pure."""
from __future__ import annotations

from pathlib import Path

import pytest

from console.control.operator_unit import (profile_drafter_values, profile_server_values, program_from_unit,
                                           unit_drift, unit_settings)
from console.parsers.systemd_unit import parse_unit_show
from console.parsers.vllm_cmdline import CmdlineError, read_serve_argv, server_python
from console.profile import load_profile, profile_from_dict

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = Path(__file__).parent / "samples" / "systemd"
SEED_UNIT = ["/opt/venv/bin/vllm", "serve", "/shared/kimi-k2.5-int4", "--tensor-parallel-size", "8",
             "--trust-remote-code", "--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2"]


def test_no_served_model_name_means_the_model_path_as_given():
    s = read_serve_argv(SEED_UNIT)
    assert (s.model, s.served_id, s.port, s.tensor_parallel_size) == ("/shared/kimi-k2.5-int4",
                                                                      "/shared/kimi-k2.5-int4", 8000, 8)
    assert s.reasoning_parser == "kimi_k2" and s.trust_remote_code and s.served_model_names == ()


@pytest.mark.parametrize("argv, expect", [
    (["vllm", "serve", "m", "--served-model-name", "a", "b", "--port=9000"], ("m", "a", 9000, 1)),
    (["vllm", "serve", "--model", "m2", "-tp", "4", "--served_model_name=x"], ("m2", "x", 8000, 4)),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m3", "--tensor_parallel_size=2"],
     ("m3", "m3", 8000, 2)),
    (["/usr/bin/env", "A=1", "/venv/bin/vllm", "serve", "m4", "--model", "ignored"], ("m4", "m4", 8000, 1)),
])
def test_vllm_command_lines(argv, expect):
    s = read_serve_argv(argv)
    assert (s.model, s.served_id, s.port, s.tensor_parallel_size) == expect


@pytest.mark.parametrize("argv, message", [
    (["python3", "-m", "sim.vllm_server", "--model", "m"], "not a vLLM server command line"),
    (["vllm", "serve", "--port", "1"], "no model"),
    (["vllm", "serve", "m", "--port", "x"], "expected integers"),
    (["vllm", "serve", "m", "--served-model-name"], "without a name"),
    (["vllm", "serve", "m", "--reasoning-parser"], "without a value"),
])
def test_bad_command_lines(argv, message):
    with pytest.raises(CmdlineError, match=message):
        read_serve_argv(argv)


def test_the_interpreter_a_server_runs_vllm_with():
    """The bench runs `vllm bench serve` through it (backend/bench/vllm_cli.py); the demo engine's own line."""
    from console import demo

    assert server_python(demo.engine_command("/v/bin/python", "/m", "m", 8000)) == "/v/bin/python"
    assert server_python(["python3", "-m", "vllm.entrypoints.cli.main", "serve", "m"]) == "python3"
    assert server_python(SEED_UNIT) is None  # `vllm serve`: the CLI is on PATH
    assert server_python(["${VENV}/bin/python", "-m", "vllm.entrypoints.openai.api_server"]) is None
    assert server_python(["env", "A=1", "-m", "vllm.entrypoints.openai.api_server"]) is None
    assert server_python(["python3", "-m", "sim.vllm_server", "--model", "m"]) is None


def seed_settings():
    return read_serve_argv(SEED_UNIT)


def test_the_seed_profile_matches_the_seed_unit():
    assert unit_drift(load_profile(ROOT / "profiles/kimi-k25-int4.toml"), seed_settings()) == []


def test_drift_is_reported_field_by_field():
    p = load_profile(ROOT / "profiles/kimi-k25-int4.toml")
    p.server.served_model_name = "kimi-k2.5-int4"
    p.server.port = 8001
    p.server.vllm_args = ["--tensor-parallel-size", "4"]
    p.server.reasoning_parser = None
    p.gpus.count = 4
    drift = unit_drift(p, seed_settings())
    assert [line.split(":")[0] for line in drift] == [
        "served model id", "server.port", "server.reasoning_parser", "tensor parallel size (server.vllm_args)",
        "gpus.count"]
    assert "'kimi-k2.5-int4'" in drift[0] and "'/shared/kimi-k2.5-int4'" in drift[0]
    assert "without --served-model-name vLLM serves the model path as given" in drift[0]


def test_a_config_file_is_named_not_compared():
    s = read_serve_argv([*SEED_UNIT, "--config", "/etc/vllm/kimi.yaml"])
    assert unit_drift(load_profile(ROOT / "profiles/kimi-k25-int4.toml"), s) == [
        "the unit reads more options from --config /etc/vllm/kimi.yaml: not compared"]


def test_a_profile_written_from_the_unit_matches_it():
    program = program_from_unit(parse_unit_show((SAMPLES / "unit_show_vllm.txt").read_text()),
                                (SAMPLES / "unit_exec_vllm.json").read_text())
    settings = unit_settings(program)
    values = profile_server_values(settings)
    assert values == {"model_path": "/shared/kimi-k2.5-int4", "port": 8000, "reasoning_parser": "kimi_k2",
                      "vllm_args": ["--tensor-parallel-size", "8", "--trust-remote-code"]}
    assert profile_drafter_values(settings) == {"trust_remote_code": True}
    p = profile_from_dict({"host": {"name": "gpu-host.example"}, "paths": {"work_dir": "/data/eagle3"},
                           "server": {"unit": "vllm-kimi", **values}, "drafter": profile_drafter_values(settings)})
    assert p.server.model_id == "/shared/kimi-k2.5-int4" and unit_drift(p, settings) == []


def test_trust_remote_code_follows_the_unit():
    """speculators loads Kimi's remote-code processor only with trust_remote_code: a profile saying false
    for a unit passing --trust-remote-code fails prepare, so `profile check` names it."""
    p = load_profile(ROOT / "profiles/kimi-k25-int4.toml")
    p.drafter.trust_remote_code = False
    drift = unit_drift(p, seed_settings())
    assert len(drift) == 1 and drift[0].startswith("drafter.trust_remote_code: the profile says false, the unit "
                                                   "passes --trust-remote-code")
    p.drafter.trust_remote_code = True
    plain = read_serve_argv([a for a in SEED_UNIT if a != "--trust-remote-code"])
    p.server.vllm_args = ["--tensor-parallel-size", "8"]
    assert [d.split(":")[0] for d in unit_drift(p, plain)] == ["drafter.trust_remote_code"]


def test_a_unit_user_other_than_root_or_the_ssh_user_is_named_with_the_fix():
    from console.control.operator_unit import unit_user_refusal
    from console.control.units import ServerProgram

    def of(user):
        return unit_user_refusal(ServerProgram(argv=tuple(SEED_UNIT), user=user), "vllm-kimi", "ubuntu", "/data/e3")

    assert of(None) is None and of("root") is None and of("0") is None and of("ubuntu") is None
    why = of("vllm")
    assert why and why.startswith("the unit vllm-kimi runs as User=vllm, the SSH user is ubuntu: the extraction "
                                  "server runs as vllm and could not write its staging dir under /data/e3/")
    assert 'Fix: connect as vllm ([host].user = "vllm" in the profile), or run the unit as ubuntu or root' in why
