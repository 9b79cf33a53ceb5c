"""The deep readiness check against the stand-in: which reasoning field each vLLM version uses."""
from __future__ import annotations

import httpx
import pytest

from console.profile import profile_from_dict
from console.telemetry.http_checks import deep_check
from harness.sim_support import MODEL, SimServer


def profile(**server):
    return profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                              "server": {"model_path": MODEL, "manager": "tmux", "unit": "u", **server},
                              "paths": {"work_dir": "/tmp"}})


@pytest.mark.parametrize("version,field", [("0.11.0", "reasoning_content"), ("0.13.0", "reasoning"),
                                           ("0.33.0", "reasoning")])
async def test_deep_check_reports_the_reasoning_field(tmp_path, version, field):
    server = SimServer(tmp_path, "--vllm-version", version, "--text-backend", "canned").start()
    try:
        server.wait_ready()
        async with httpx.AsyncClient(base_url=server.url) as client:
            result = await deep_check(client, profile())
        assert result.ok and result.content and result.reasoning, result.message
        assert result.reasoning_field == field  # 0.13 sends both: `reasoning` is read first
    finally:
        server.terminate()


async def test_deep_check_fails_when_reasoning_is_expected_but_absent(tmp_path):
    server = SimServer(tmp_path, "--text-backend", "canned").start()
    try:
        server.wait_ready()
        p = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                               "server": {"model_path": MODEL, "manager": "tmux", "unit": "u"},
                               "paths": {"work_dir": "/tmp"},
                               "generate": {"chat_template_kwargs": {"thinking": False}}})
        async with httpx.AsyncClient(base_url=server.url) as client:
            result = await deep_check(client, p)
            assert not result.ok and "expects reasoning" in result.message
            wrong = await deep_check(client, profile(served_model_name="other-model"))
        assert not wrong.ok and "404" in wrong.message
    finally:
        server.terminate()
