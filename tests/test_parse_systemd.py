from __future__ import annotations

from pathlib import Path

import pytest

from console.snapshot import ServiceInfo
from console.parsers.systemd import (SYSTEMCTL_SHOW_PROPS, parse_props, parse_systemctl_show,
                                     read_unit_status, systemctl_show_argv)

SAMPLES = Path(__file__).parent / "samples" / "systemd"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text(encoding="utf-8")


def test_props_and_argv():
    assert SYSTEMCTL_SHOW_PROPS == ["ActiveState", "SubState", "Result", "NRestarts", "ExecMainPID",
                                    "ActiveEnterTimestamp", "MemoryCurrent", "LoadState", "InvocationID"]
    assert systemctl_show_argv("vllm.service") == [
        "systemctl", "show", "vllm.service", "-p",
        "ActiveState,SubState,Result,NRestarts,ExecMainPID,ActiveEnterTimestamp,MemoryCurrent,LoadState,"
        "InvocationID",
        "--no-pager"]


def test_active_unit():
    assert parse_systemctl_show(sample("active.txt"), "vllm.service") == ServiceInfo(
        manager="systemd", unit="vllm.service", active_state="active", sub_state="running", restarts=2,
        since="Sun 2024-06-02 08:00:01 UTC", main_pid=40211, memory_bytes=4411394560, result="success")
    assert read_unit_status(sample("active.txt"), "vllm.service").note is None


def test_failed_unit_not_set_values():
    s = parse_systemctl_show(sample("failed.txt"), "vllm.service")
    assert (s.active_state, s.sub_state, s.result, s.restarts) == ("failed", "failed", "exit-code", 5)
    assert (s.main_pid, s.since, s.memory_bytes) == (None, None, None)


def test_memory_infinity_means_unknown():
    s = parse_systemctl_show(sample("no_accounting.txt"), "vllm.service")
    assert (s.active_state, s.sub_state, s.memory_bytes, s.since) == ("activating", "auto-restart", None, None)


def test_missing_unit():
    status = read_unit_status(sample("not_found.txt"), "vllm.service")
    assert (status.service.active_state, status.load_state) == ("inactive", "not-found")
    assert "vllm.service not found" in status.note


@pytest.mark.parametrize("load_state,needle", [("masked", "masked"), ("error", "failed to load"),
                                               ("bad-setting", "failed to load")])
def test_unusual_load_states_have_notes(load_state, needle):
    status = read_unit_status(f"LoadState={load_state}\nActiveState=inactive\n", "x.service")
    assert needle in status.note


@pytest.mark.parametrize("text", ["", None, "garbage without equals", "=value\n", "Failed to connect to bus: "
                                  "No such file or directory", "NRestarts=-3\nExecMainPID=abc\nMemoryCurrent=1e9"])
def test_malformed_is_unknown_not_an_exception(text):
    s = parse_systemctl_show(text, "u")
    assert s.manager == "systemd" and s.unit == "u"
    assert (s.restarts, s.main_pid, s.memory_bytes) == (None, None, None)


def test_values_may_contain_equals():
    assert parse_props("Environment=A=1 B=2\n")["Environment"] == "A=1 B=2"
