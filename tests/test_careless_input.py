"""Careless input: values with a trailing newline (`$` in a regex accepts one), tmux session names tmux
would misread, and dataset paths that only make sense where they were typed."""
from __future__ import annotations

import pytest

from backend.contract.runs import RunDirError, run_path
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


# -- dataset paths ---------------------------------------------------------------------------------------

def dataset_profile(tmp_path, transport: str, **paths):
    from console.profile import profile_from_dict
    return profile_from_dict({"host": {"name": "gpu-host.example", "transport": transport},
                              "server": {"manager": "tmux", "unit": "e3t-ds", "model_path": "/m", "port": 1},
                              "paths": {"work_dir": str(tmp_path / "w"), **paths}})


async def test_relative_dataset_on_a_local_host_is_the_callers_directory(tmp_path, monkeypatch):
    from console.control.launch import resolve_dataset
    from console.host.local import LocalHost
    monkeypatch.chdir(tmp_path)
    p = dataset_profile(tmp_path, "local")
    assert await resolve_dataset(LocalHost(), p, "data/prompts.jsonl") == str(tmp_path / "data/prompts.jsonl")
    assert await resolve_dataset(LocalHost(), p, "./a/../b.jsonl") == str(tmp_path / "b.jsonl")
    assert await resolve_dataset(LocalHost(), p, "/abs/x.jsonl") == "/abs/x.jsonl"


async def test_relative_dataset_on_an_ssh_host_is_the_data_dir(tmp_path, monkeypatch):
    from console.control.launch import resolve_dataset
    from console.host.local import LocalHost
    p = dataset_profile(tmp_path, "ssh", data_dir="/data/sets")
    host = LocalHost()  # stands in for the remote shell: only `printf %s "$HOME"` is asked of it
    assert await resolve_dataset(host, p, "prompts.jsonl") == "/data/sets/prompts.jsonl"
    assert await resolve_dataset(host, p, "../other/x.jsonl") == "/data/other/x.jsonl"
    monkeypatch.setenv("HOME", "/home/op")
    assert await resolve_dataset(host, p, "~/sets/x.jsonl") == "/home/op/sets/x.jsonl"
    with pytest.raises(StageError, match="~user"):
        await resolve_dataset(host, p, "~bob/x.jsonl")


@pytest.mark.parametrize("value, why", [
    ("/data/x.jsonl\n", "control characters"),
    ("/data/x\x00.jsonl", "control characters"),
    ("/data/x\t.jsonl", "control characters"),
    (" /data/x.jsonl", "spaces"),
    ("", "no dataset"),
])
async def test_bad_dataset_paths_are_refused_before_anything_runs(tmp_path, value, why):
    from console.control.launch import resolve_dataset
    from console.host.local import LocalHost
    with pytest.raises(StageError, match=why):
        await resolve_dataset(LocalHost(), dataset_profile(tmp_path, "ssh"), value)


@pytest.mark.timeout(60)
async def test_wait_reports_a_stage_that_died_before_its_first_event(tmp_path, capsys):
    """It used to say nothing for two minutes, then 'no events'."""
    import time

    from console.commands.run_cmd import follow_run
    from console.control.units import stage_log_path
    from console.control.units import tmux_start_argv
    from console.host.factory import host_for_profile
    from console.profile import profile_from_dict
    from console.session import Session

    work = tmp_path / "w"
    (work / "tmux").mkdir(parents=True, mode=0o700)
    p = profile_from_dict({"host": {"name": "gpu-host.example", "transport": "local", "simulated": True},
                           "server": {"manager": "tmux", "unit": "e3t-srv", "model_path": "/m", "port": 1},
                           "paths": {"work_dir": str(work)}, "gpus": {"command": ["true"]}})
    host = host_for_profile(p)
    unit = "e3-generate-r1"
    start = tmux_start_argv(unit, ["sh", "-c", "echo 'error: /d/x.jsonl: no such file' >&2; exit 2"],
                            stage_log_path(p, unit))
    assert (await host.run(start)).ok
    try:
        t0 = time.monotonic()
        async with Session(p, interval=0.2) as session:
            assert await follow_run(session, "generate", "r1") == 1
        assert time.monotonic() - t0 < 20
        err = capsys.readouterr().err
        assert "exit status 2" in err and "no such file" in err
    finally:
        await host.run(["tmux", "kill-server"])
