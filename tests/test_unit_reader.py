"""The operator's unit read from systemd's own output (samples taken on the booted rig, systemd 252)."""
from __future__ import annotations

from pathlib import Path

import pytest

from console.parsers.systemd_unit import (UnitReadError, bus_label, exec_start_json_argv, parse_exec_json,
                                          parse_exec_show, parse_unit_show, server_exec, split_environment)

SAMPLES = Path(__file__).parent / "samples" / "systemd"
VLLM_ARGV = ["/opt/venv/bin/vllm", "serve", "/shared/kimi-k2.5-int4", "--tensor-parallel-size", "8",
             "--trust-remote-code", "--port", "8000", "--gpu-memory-utilization", "0.92", "--compilation-config",
             '{"level": 3}', "--reasoning-parser", "kimi_k2"]


def test_vllm_unit_show():
    d = parse_unit_show((SAMPLES / "unit_show_vllm.txt").read_text())
    assert d.unit == "vllm-kimi.service" and d.load_state == "loaded"
    assert d.environment == (("NCCL_P2P_DISABLE", "1"), ("NCCL_IB_HCA", "mlx5_0 mlx5_1"),
                             ("PATH", "/opt/venv/bin:/usr/bin"), ("LITERAL", "$HOME"), ("Q", 'it"s'), ("EMPTY", ""))
    assert d.environment_files == (("/etc/default/vllm-kimi", True),)
    assert (d.user, d.group, d.working_directory) == ("nobody", "nogroup", "!/opt/vllm")
    ex = server_exec(d)
    assert not ex.exact and ex.path == "/opt/venv/bin/vllm"
    # systemctl show joins the arguments with spaces: the JSON argument comes back split in two
    assert ex.argv[-4:] == ("{\"level\":", "3}", "--reasoning-parser", "kimi_k2")


def test_exact_argv_from_busctl_json():
    (ex,) = parse_exec_json((SAMPLES / "unit_exec_vllm.json").read_text())
    assert ex.exact and ex.command == VLLM_ARGV


def test_started_unit_multiline_values():
    d = parse_unit_show((SAMPLES / "unit_show_started.txt").read_text())
    assert d.env == {"NCCL_P2P_DISABLE": "1", "NCCL_IB_HCA": "mlx5 x", "PATH": "/opt/venv/bin:/usr/bin", "EMPTY": "",
                     "Q": 'its "x"', "BACK": "a\\b"}
    assert d.environment_files == (("/etc/default/vllm-missing", True), ("/tmp/vllm.env", False))
    assert server_exec(d).argv == ("/bin/sleep", "1000", "a", "b", '{"x":', "1}", "semi\\;colon", "$$literal")


def test_not_found_unit_is_refused():
    d = parse_unit_show((SAMPLES / "unit_show_not_found.txt").read_text(), "vllm-nope")
    assert d.load_state == "not-found" and d.exec_start == ()
    with pytest.raises(UnitReadError, match="LoadState=not-found"):
        server_exec(d)
    assert parse_exec_json('{"type":"a(sasbttttuii)","data":[]}') == ()


@pytest.mark.parametrize("text", ["", "not json", '{"type":"s","data":"x"}', '{"type":"a(sasbttttuii)","data":[[1]]}'])
def test_bad_busctl_answers(text):
    with pytest.raises(UnitReadError, match="busctl ExecStart"):
        parse_exec_json(text)


@pytest.mark.parametrize("value", ["/bin/x a", "{ path=/bin/x ; ignore_errors=no }", "{ path=/x ; argv[]=/x }"])
def test_bad_exec_values(value):
    with pytest.raises(UnitReadError, match="ExecStart"):
        parse_exec_show(value)


def test_environment_words():
    assert split_environment('A=1  "B=x y" "C=\\$D\\"\\\\"') == ["A=1", "B=x y", 'C=$D"\\']
    with pytest.raises(UnitReadError, match="unterminated"):
        split_environment('"A=1')
    with pytest.raises(UnitReadError, match="NAME=VALUE"):
        parse_unit_show("Environment=novalue\n")


def test_bus_label_matches_systemd():
    assert bus_label("vllm-kimi.service") == "vllm_2dkimi_2eservice"  # the path busctl answered on the rig
    assert bus_label("1x.service").startswith("_31")
    assert exec_start_json_argv("vllm-kimi")[4] == "/org/freedesktop/systemd1/unit/vllm_2dkimi_2eservice"


def test_secret_looking_values_are_hidden_in_shown_commands():
    from backend.kit.redact import redacted

    argv = ["systemd-run", "--setenv=HF_TOKEN=hf_x", "--setenv=NCCL_P2P_DISABLE=1", "env", "OPENAI_API_KEY=k",
            "--api-key=sk-eq", "vllm", "serve", "/m", "--api-key", "sk-space", "--tokenizer", "/tok",
            "--max-num-batched-tokens", "8192", "--setenv=HTTPS_PROXY=http://alice:pw-secret@proxy.example:3128",
            "sh", "-c", "exec vllm serve /m --api-key sk-inner --hf-token=hf_inner"]
    assert redacted(argv) == ["systemd-run", "--setenv=HF_TOKEN=***", "--setenv=NCCL_P2P_DISABLE=1", "env",
                              "OPENAI_API_KEY=***", "--api-key=***", "vllm", "serve", "/m", "--api-key", "***",
                              "--tokenizer", "/tok", "--max-num-batched-tokens", "8192",
                              "--setenv=HTTPS_PROXY=http://alice:***@proxy.example:3128",
                              "sh", "-c", "exec vllm serve /m --api-key *** --hf-token=***"]


def test_a_rate_per_token_is_not_a_secret():
    """The demo's `--latency-per-token 0.01` read `--latency-per-token ***` in every recorded server command."""
    from backend.kit.redact import redacted, redacted_text

    assert redacted(["sim", "--latency-per-token", "0.01", "--access-token", "t0k", "--latency-per-token=0.02"]) \
        == ["sim", "--latency-per-token", "0.01", "--access-token", "***", "--latency-per-token=0.02"]
    assert redacted_text("x --latency-per-token 0.01 --hf-token hf_x") == "x --latency-per-token 0.01 --hf-token ***"


def test_deeply_nested_busctl_answer_is_a_clean_error():
    """A host answering busctl with 100000 nested arrays: json.loads would recurse once per level and end
    `profile init --from-unit` in a RecursionError traceback; the reader refuses it by depth, naming the bound."""
    from console.control.operator_unit import program_from_unit
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(UnitReadError, match=r"busctl ExecStart: the JSON answer \(200000 characters.*deeper than 64"):
        parse_exec_json(deep)
    d = parse_unit_show((SAMPLES / "unit_show_vllm.txt").read_text())
    with pytest.raises(UnitReadError, match="deeper than 64"):
        program_from_unit(d, '{"type":"a(sasbttttuii)","data":' + deep + "}")
    # brackets inside strings are not nesting: an argument may hold any number of them
    text = '{"type":"a(sasbttttuii)","data":[["/bin/x",["/bin/x","' + "[" * 200 + '\\"{"]]]}'
    (ex,) = parse_exec_json(text)
    assert ex.argv == ("/bin/x", "[" * 200 + '"{')
