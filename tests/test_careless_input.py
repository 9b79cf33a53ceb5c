"""Careless input: values with a trailing newline (`$` in a regex accepts one), tmux session names tmux
would misread, and dataset paths that only make sense where they were typed."""
from __future__ import annotations

import pytest

from backend.runs import RunDirError, run_path
from console.control.launch import StageError, check_run_id
from console.host.jump import parse_jump_host
from console.profile import ProfileError, profile_from_dict
from console.ui.keys import KeymapError, parse_keymap

BASE = {
    "host": {"name": "gpu-host.example", "user": "ubuntu"},
    "server": {"model_path": "/shared/kimi-k2.5-int4", "unit": "vllm-kimi"},
    "paths": {"work_dir": "/data/eagle3"},
}


def with_value(section: str, key: str, value) -> dict:
    data = {k: dict(v) for k, v in BASE.items()}
    data.setdefault(section, {})[key] = value
    return data


@pytest.mark.parametrize("section, key, value", [
    ("host", "name", "gpu-host.example\n"),
    ("host", "name", "::1\n"),
    ("host", "user", "ubuntu\n"),
    ("host", "jump_host", "ops@bastion\n"),
    ("host", "identity_file", "~/.ssh/id_ed25519\n"),
    ("server", "unit", "vllm-kimi\n"),
    ("server", "model_path", "/shared/kimi\n"),
    ("server", "served_model_name", "kimi\n"),
    ("server", "api_key_env", "VLLM_API_KEY\n"),
    ("paths", "work_dir", "/data/eagle3\n"),
    ("generate", "dataset", "/data/prompts.jsonl\n"),
])
def test_a_trailing_newline_is_refused_everywhere(section, key, value):
    with pytest.raises(ProfileError) as exc:
        profile_from_dict(with_value(section, key, value), file="p.toml")
    assert any(k == f"{section}.{key}" for k, _ in exc.value.problems), exc.value.problems


@pytest.mark.parametrize("unit", ["vllm-kimi\n", "vllm#kimi", "vllm.kimi", "vllm:kimi"])
def test_tmux_session_names_tmux_would_misread(unit):
    data = with_value("server", "unit", unit)
    data["server"]["manager"] = "tmux"
    with pytest.raises(ProfileError) as exc:
        profile_from_dict(data, file="p.toml")
    assert exc.value.problems[0][0] == "server.unit"


def test_run_ids_and_jump_hosts_with_a_trailing_newline():
    with pytest.raises(StageError):
        check_run_id("x\n")  # it left an orphan tmux session `e3-generate-x\n`
    assert check_run_id("generate-20250101-120000") == "generate-20250101-120000"
    with pytest.raises(RunDirError):
        run_path("/w", "x\n")
    with pytest.raises(ValueError):
        parse_jump_host("ops@bastion:22\n:x")
    with pytest.raises(ValueError):
        parse_jump_host("bastion:2²")


def test_keymap_key_names_are_whole_strings():
    with pytest.raises(KeymapError):
        parse_keymap('quit = "q\\nx"')
