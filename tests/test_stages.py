"""The API key reaches a detached stage as a 0600 file, never in its command line."""
from __future__ import annotations

import asyncio
import os
import re
import stat

import pytest

from console.profile import profile_from_dict
from console.host.local import LocalHost
from console.control.launch import upload_api_key
from console.control.stage_argv import generate_argv


def test_api_key_is_uploaded_private_and_never_in_argv(tmp_path, monkeypatch):
    monkeypatch.setenv("E3_TEST_VLLM_KEY", "sk-very-secret")
    p = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                           "server": {"model_path": "/m", "manager": "tmux", "unit": "u",
                                      "api_key_env": "E3_TEST_VLLM_KEY"},
                           "paths": {"work_dir": str(tmp_path)}, "generate": {"dataset": "/d.jsonl"}})
    path = asyncio.run(upload_api_key(LocalHost(), p, "r1"))
    assert path and open(path).read().strip() == "sk-very-secret"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    argv = generate_argv(p, "r1", api_key_path=path)
    assert "sk-very-secret" not in " ".join(argv) and argv[argv.index("--api-key-file") + 1] == path


def test_no_key_no_file(tmp_path):
    p = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                           "server": {"model_path": "/m", "manager": "tmux", "unit": "u"},
                           "paths": {"work_dir": str(tmp_path)}})
    assert asyncio.run(upload_api_key(LocalHost(), p, "r1")) is None
    assert not (tmp_path / "secrets").exists()


def test_backend_is_uploaded_once_per_content(tmp_path, monkeypatch):
    """The host gets the backend when its copy is older (another content hash), and nothing otherwise."""
    from console.control import launch as stages
    p = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                           "server": {"model_path": "/m", "manager": "tmux", "unit": "u"},
                           "paths": {"work_dir": str(tmp_path)}})
    shown: list[str] = []
    code_dir = asyncio.run(stages.ensure_backend(LocalHost(), p, shown))
    assert len(shown) == 1 and (tmp_path / "code").is_dir()
    assert os.path.exists(os.path.join(code_dir, "backend", "generate", "__main__.py"))
    again: list[str] = []
    assert asyncio.run(stages.ensure_backend(LocalHost(), p, again)) == code_dir and again == []
    version, bundle = stages.backend_bundle()
    monkeypatch.setattr(stages, "backend_bundle", lambda: ("0123456789abcdef", bundle))
    newer: list[str] = []
    assert asyncio.run(stages.ensure_backend(LocalHost(), p, newer)).endswith("/0123456789abcdef")
    assert len(newer) == 1 and version != "0123456789abcdef"


def test_live_stage_units_from_real_listings():
    from console.control.units import parse_live_stage_units
    systemd = profile_from_dict({"host": {"name": "gpu-host.example"}, "server": {"model_path": "/m", "unit": "v"},
                                 "paths": {"work_dir": "/w"}})
    listing = ("e3-generate-g1.service loaded active running /usr/bin/python3 -m backend.generate --dataset x\n"
               "e3-generate-old.service loaded activating start /usr/bin/python3 -m backend.generate\n")
    assert parse_live_stage_units(systemd, "generate", listing) == ["e3-generate-g1", "e3-generate-old"]
    assert parse_live_stage_units(systemd, "train", listing) == []
    tmux = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                              "server": {"model_path": "/m", "manager": "tmux", "unit": "v"},
                              "paths": {"work_dir": "/w"}})
    panes = "v 0\ne3-generate-a 0\ne3-generate-b 1\ne3-train-t 0\n"
    assert parse_live_stage_units(tmux, "generate", panes) == ["e3-generate-a"]  # b exited


def test_the_runs_key_copy_is_its_own_and_removed_once_read(tmp_path, monkeypatch):
    """The key file does not stay in the host's secrets/ after the run: generate removes its own copy as
    soon as it has read it (also when the file is unusable), before anything that may fail or be stopped."""
    from backend.generate.client import read_api_key
    from backend.generate.config import parse_config

    monkeypatch.setenv("E3_TEST_VLLM_KEY", "sk-very-secret")
    p = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                           "server": {"model_path": "/m", "manager": "tmux", "unit": "u",
                                      "api_key_env": "E3_TEST_VLLM_KEY"},
                           "paths": {"work_dir": str(tmp_path)}, "generate": {"dataset": "/d.jsonl"}})
    (tmp_path / "secrets").mkdir(mode=0o700)
    (tmp_path / "secrets" / "vllm-api-key").write_text("sk-very-secret\n")  # the shared copy of older consoles
    path = asyncio.run(upload_api_key(LocalHost(), p, "gen-7"))
    assert re.fullmatch(rf"{tmp_path}/secrets/vllm-api-key-gen-7\.[0-9a-f]{{8}}", path)
    assert os.listdir(tmp_path / "secrets") == [os.path.basename(path)]  # the shared one is gone
    # each start of a run has its own copy: a second start refused by the run lock removes only its own
    again = asyncio.run(upload_api_key(LocalHost(), p, "gen-7"))
    assert again != path and os.path.exists(path)
    os.unlink(again)
    argv = generate_argv(p, "gen-7", api_key_path=path)
    config = parse_config(argv[argv.index("backend.generate") + 1:])
    assert config.api_key_file == path and config.remove_api_key_file is True
    # the preflight reads it too, before the run: it leaves it for the run
    assert "--remove-api-key-file" not in generate_argv(p, "gen-7", api_key_path=path, preflight_only=True)
    assert read_api_key(None, path, remove=True) == "sk-very-secret"
    assert not os.path.exists(path) and os.listdir(tmp_path / "secrets") == []
    empty = tmp_path / "secrets" / "vllm-api-key-gen-8"
    empty.write_text("")
    with pytest.raises(ValueError, match="the file is empty"):
        read_api_key(None, str(empty), remove=True)
    assert not empty.exists()
