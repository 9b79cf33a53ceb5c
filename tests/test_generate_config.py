"""Flags, --config FILE.json and the preflight's pure parts (no server)."""
from __future__ import annotations

import json

import pytest

from backend.generate.client import backoff_delay, read_api_key
from backend.generate.config import ConfigError, parse_config
from backend.generate.preflight import REQUIRED_MODULES, check_disk, check_modules, estimate_bytes, modules_for
from backend.kit.preflight import PreflightReport


def test_config_file_and_flag_precedence(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dataset": "/d", "model": "m", "max-tokens": 100, "concurrency": 7,
                               "chat_template_kwargs": {"thinking": True}, "expect_reasoning": False,
                               "temperature": 1}))
    c = parse_config(["--config", str(cfg), "--max-tokens", "200"])
    assert (c.max_tokens, c.concurrency, c.expect_reasoning) == (200, 7, False)
    assert c.chat_template_kwargs == {"thinking": True}
    assert c.sampling_params() == {"temperature": 1.0}
    assert isinstance(c.temperature, float)


@pytest.mark.parametrize("content, match", [
    ({"dataset": "/d", "model": "m", "bogus": 1}, "unknown key 'bogus'"),
    ({"dataset": "/d", "model": "m", "concurrency": "many"}, "concurrency has the wrong type"),
    ([1], "expected a JSON object"),
])
def test_bad_config_files(tmp_path, content, match):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=match):
        parse_config(["--config", str(cfg)])


@pytest.mark.parametrize("argv, match", [
    (["--model", "m"], "--dataset is required"),
    (["--dataset", "d"], "--model is required"),
    (["--dataset", "d", "--model", "m", "--concurrency", "0"], "--concurrency must be >= 1"),
    (["--dataset", "d", "--model", "m", "--return-token-ids", "maybe"], "auto, on or off"),
    (["--dataset", "d", "--model", "m", "--endpoint", "127.0.0.1:8000"], "http"),
])
def test_invalid_flags(argv, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(argv)


def test_api_key_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("GEN_KEY", "sekrit\n")
    assert read_api_key("GEN_KEY", None) == "sekrit"
    with pytest.raises(ValueError, match="not set"):
        read_api_key("GEN_KEY_MISSING", None)
    key = tmp_path / "key"
    key.write_text("k2\n")
    assert read_api_key(None, str(key)) == "k2"
    with pytest.raises(ValueError, match="cannot read"):
        read_api_key(None, str(tmp_path / "nope"))
    assert read_api_key(None, None) is None


def test_backoff_is_bounded():
    assert all(0 <= backoff_delay(a, 1.0, 5.0) <= 5.0 for a in range(1, 20))


def test_preflight_disk_and_modules(tmp_path):
    report = PreflightReport()
    check_disk(report, str(tmp_path / "not" / "yet"), need=10**18)
    check_modules(report, ("json", "no_such_module_xyz"))
    disk, mods = report.checks
    assert not disk.ok and "--work-dir" in disk.fix
    assert not mods.ok and "no_such_module_xyz" in mods.detail and "pip install no_such_module_xyz" in mods.fix
    assert not report.ok and "disk_space" in report.failures()
    assert estimate_bytes(10, 100, True, 50) > estimate_bytes(10, 100, False, 50) > 0


def test_preflight_asks_for_datasets_only_where_the_dataset_needs_it(tmp_path):
    """jsonl is read with json alone, so a host with only aiohttp (the demo's, from a plain install) passes."""
    (tmp_path / "a.jsonl").write_text("{}\n")
    assert modules_for(str(tmp_path / "a.jsonl")) == ("aiohttp",)
    assert modules_for(str(tmp_path)) == ("aiohttp",)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.parquet").write_bytes(b"")
    assert modules_for(str(tmp_path)) == REQUIRED_MODULES  # one parquet file among them: datasets + pyarrow
    assert modules_for(str(tmp_path / "c.json")) == REQUIRED_MODULES  # missing: ask for everything
    assert {"datasets", "pyarrow"} <= set(REQUIRED_MODULES)
