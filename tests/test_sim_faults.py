"""Run-time faults of the stand-in: set by flag or through POST /_sim/fault (simulated only)."""
from __future__ import annotations

import time

import httpx
import pytest

from harness.sim_support import SimServer

pytestmark = pytest.mark.timeout(60)
ASK = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 20}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sim = SimServer(tmp_path_factory.mktemp("simf")).start()
    try:
        yield sim.wait_ready()
    finally:
        sim.kill()


def _fault(sim: SimServer, kind: str, value=None) -> dict:
    resp = sim.post("/_sim/fault", {"kind": kind, "value": value})
    assert resp.status_code == 200, resp.text
    return resp.json()["faults"]


def test_fault_endpoint_rejects_bad_input(server):
    assert server.get("/_sim/fault").json()["simulated"] is True
    resp = server.post("/_sim/fault", {"kind": "melt"})
    assert resp.status_code == 400 and "unknown fault 'melt'" in resp.json()["error"]
    assert server.post("/_sim/fault", {"value": 3}).status_code == 400
    assert server.post("/_sim/fault", {"kind": "5xx", "value": "many"}).status_code == 400


def test_error_burst(server):
    _fault(server, "5xx", 2)
    codes = [server.post("/v1/chat/completions", ASK).status_code for _ in range(3)]
    assert codes == [500, 500, 200]
    _fault(server, "5xx", 1)
    body = server.post("/v1/chat/completions", ASK).json()
    assert body["error"]["type"] == "InternalServerError" and body["error"]["code"] == 500
    assert server.get("/health").status_code == 200  # only generation is hit


def test_slow(server):
    _fault(server, "slow", 0.4)
    t0 = time.monotonic()
    assert server.post("/v1/chat/completions", ASK).status_code == 200
    assert time.monotonic() - t0 >= 0.4
    _fault(server, "clear")


def test_stall_accepts_and_never_answers(server):
    _fault(server, "stall")
    with pytest.raises(httpx.ReadTimeout):
        server.post("/v1/chat/completions", ASK, timeout=0.5)
    assert server.get("/health").status_code == 200
    _fault(server, "clear")
    assert server.post("/v1/chat/completions", ASK).status_code == 200


def test_engine_dead(server):
    _fault(server, "engine-dead", 1)  # after one more answered request
    assert server.post("/v1/chat/completions", ASK).status_code == 200
    assert server.get("/health").status_code == 503 and server.get("/ping").status_code == 503
    resp = server.post("/v1/chat/completions", ASK)
    assert resp.status_code == 500 and "EngineCore encountered an issue" in resp.text
    out = server.output()
    assert "EngineCore encountered a fatal error." in out and "EngineDeadError" in out
    _fault(server, "clear")
    assert server.get("/health").status_code == 200


def test_die_after_kills_the_process_mid_request(tmp_path):
    sim = SimServer(tmp_path, "--fault", "die-after:2").start()
    try:
        sim.wait_ready()
        assert [sim.post("/v1/chat/completions", ASK).status_code for _ in range(2)] == [200, 200]
        with pytest.raises(httpx.TransportError):
            sim.post("/v1/chat/completions", ASK)
        assert sim.wait_exit() == 1
    finally:
        sim.kill()
    assert "EngineCore encountered a fatal error." in sim.output()
    assert "[shutdown]" not in sim.output()


def test_die_mid_stream_set_at_run_time(tmp_path):
    sim = SimServer(tmp_path).start()
    try:
        sim.wait_ready()
        _fault(sim, "die-after", 0)
        got = b""
        try:
            with httpx.stream("POST", sim.url + "/v1/chat/completions", timeout=5,
                              json={**ASK, "max_tokens": 200, "stream": True}) as resp:
                assert resp.status_code == 200
                for piece in resp.iter_raw():
                    got += piece
        except httpx.TransportError:
            pass  # the peer vanished mid-body: what a crashed server looks like
        assert b"data: {" in got and b"[DONE]" not in got
        assert sim.wait_exit() == 1
    finally:
        sim.kill()
