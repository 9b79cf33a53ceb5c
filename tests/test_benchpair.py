"""backend/benchpair.py's own guarantees, with real processes: whatever happens to a bench (it fails, it
is stopped with SIGTERM), the drafter server is stopped and the baseline serves again at the end, and
the drafter server never starts while the baseline still runs. The two servers here are marker files
handled by the plan's commands (a service manager reduced to `touch`/`rm`/`test`); the benches are the
real bench program, against the stand-in."""
from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.sim_support import REPO, SimServer

pytestmark = pytest.mark.timeout(300)
MODEL = "tiny"


class Answering:
    """A server stand-in that only answers the switch's readiness checks (/health, /v1/models)."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"data": [{"id": MODEL, "max_model_len": 4096}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def answering():
    server = Answering()
    yield server.url
    server.close()


def plan_for(tmp_path: Path, baseline_argv: list[str], drafter_argv: list[str],
             third_argv: list[str] | None = None, *, endpoint: str, lock: str = "") -> Path:
    servers = tmp_path / "servers"
    servers.mkdir(exist_ok=True)
    log = tmp_path / "server-commands.log"

    def cmd(which: str, what: str, unit: str | None = None) -> list[str]:
        flag = servers / (unit or which)
        body = {"start": f'[ -e "$1" ] && exit 3; touch "$1"', "stop": 'rm -f "$1"', "alive": '[ -e "$1" ]'}[what]
        # every start/stop is logged with which servers run at that moment
        return ["sh", "-c", f'[ "$3" = alive ] || echo "$3 $2 (running: $(ls "$4" | tr "\\n" " "))" >> "$5"; {body}',
                "sh", str(flag), which, what, str(servers), str(log)]

    def server(name: str, unit: str) -> dict:
        start = cmd(unit if name != "third" else "third", "start", unit)
        return {"name": name, "unit": unit, "start": start, "stop": cmd(unit, "stop"), "alive": cmd(unit, "alive")}

    # the published drafter: the drafter server's unit, another checkpoint
    away = ([server("third", "drafter")] if third_argv else []) + [server("drafter", "drafter")]
    plan = {"checkpoint": "/ck", "baseline": {"run_id": "p-baseline", "argv": baseline_argv},
            "drafter": {"run_id": "p-drafter", "argv": drafter_argv},
            "switch": {"version": 1, "home": server("baseline", "baseline"), "away": away, "endpoint": endpoint,
                       "ready_timeout_s": 30, "command_timeout_s": 30, "stop_check_s": 10, "lock_path": lock}}
    if third_argv:
        plan.update(third={"run_id": "p-third", "argv": third_argv}, third_checkpoint="/published")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def bench_argv(work: Path, prompts: Path, url: str, run_id: str, label: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "backend.bench", "--work-dir", str(work), "--run-id", run_id, "--endpoint", url,
            "--model", MODEL, "--prompts", str(prompts), "--label", label, "--concurrency", "1", "--num-prompts", "3",
            "--max-tokens", "20", "--client", "ours", *extra]


def pair(work: Path, plan: Path, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "backend.benchpair", "--work-dir", str(work), "--run-id", "p",
                             "--plan", str(plan)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"question {i}"}]}) + "\n"
                            for i in range(3)))
    return path


def test_a_failed_bench_still_serves_the_baseline_at_the_end(tmp_path, prompts, answering):
    work = tmp_path / "w"
    dead = "http://127.0.0.1:9"
    plan = plan_for(tmp_path, bench_argv(work, prompts, dead, "p-baseline", "baseline", "--ready-timeout", "1"),
                    bench_argv(work, prompts, dead, "p-drafter", "drafter", "--baseline-run", "p-baseline"),
                    endpoint=answering)
    (tmp_path / "servers" / "drafter").touch()  # the drafter server runs when the bench starts
    proc = pair(work, plan)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    summary = json.loads((work / "runs" / "p" / "summary.json").read_text())
    assert summary["status"] == "failed" and "bench baseline (p-baseline) failed" in summary["error"]
    assert [(s["step"], s["ok"]) for s in summary["steps"]] == [
        ("baseline serving", True), ("bench baseline", False), ("back to the baseline", True)]
    assert sorted(os.listdir(tmp_path / "servers")) == ["baseline"]
    # one server at a time: the drafter server was stopped before the baseline started; never swapped to
    assert (tmp_path / "server-commands.log").read_text().splitlines() == [
        "stop drafter (running: drafter )", "start baseline (running: )"]


def test_sigterm_stops_the_drafter_bench_and_swaps_back(tmp_path, prompts):
    work = tmp_path / "w"
    sim = SimServer(tmp_path, "--served-model-name", MODEL, "--response-tokens", "20", "--latency-per-token",
                    "0.2").start().wait_ready()
    try:
        plan = plan_for(tmp_path, bench_argv(work, prompts, sim.url, "p-baseline", "baseline"),
                        bench_argv(work, prompts, sim.url, "p-drafter", "drafter", "--baseline-run", "p-baseline"),
                        endpoint=sim.url)
        (tmp_path / "servers" / "baseline").touch()  # the baseline serves when the bench starts
        proc = pair(work, plan)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (work / "runs" / "p-drafter" / "events.jsonl").exists():
            time.sleep(0.1)
        assert (tmp_path / "servers" / "drafter").exists()  # swapped: the drafter server is being benched
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        sim.kill()
    assert proc.returncode == 0, out
    summary = json.loads((work / "runs" / "p" / "summary.json").read_text())
    assert summary["status"] == "stopped"
    assert sorted(os.listdir(tmp_path / "servers")) == ["baseline"]
    assert (tmp_path / "server-commands.log").read_text().splitlines() == [
        "stop baseline (running: baseline )", "start drafter (running: )",
        "stop drafter (running: drafter )", "start baseline (running: )"]
    finish = json.loads((work / "runs" / "p-drafter" / "events.jsonl").read_text().splitlines()[-1])
    assert finish["kind"] == "finish" and finish["status"] == "stopped"


def test_a_third_contender_is_benched_in_the_drafters_unit_and_compared_in_one_table(tmp_path, prompts):
    work = tmp_path / "w"
    sim = SimServer(tmp_path, "--served-model-name", MODEL, "--response-tokens", "8").start().wait_ready()
    try:
        plan = plan_for(tmp_path, bench_argv(work, prompts, sim.url, "p-baseline", "baseline"),
                        bench_argv(work, prompts, sim.url, "p-drafter", "drafter", "--baseline-run", "p-baseline",
                                   "--third-run", "p-third"),
                        bench_argv(work, prompts, sim.url, "p-third", "published", "--baseline-run", "p-baseline"),
                        endpoint=sim.url)
        (tmp_path / "servers" / "baseline").touch()
        proc = pair(work, plan)
        out, _ = proc.communicate(timeout=240)
    finally:
        sim.kill()
    assert proc.returncode in (0, 3), out
    summary = json.loads((work / "runs" / "p" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["runs"] == {
        "baseline": "p-baseline", "third": "p-third", "drafter": "p-drafter"}
    assert [s["step"] for s in summary["steps"] if s["ok"]] == [
        "baseline serving", "bench baseline", "swap to the published drafter", "bench published drafter",
        "swap to the drafter", "bench drafter", "back to the baseline"]
    assert {r["label"] for r in summary["comparison"]["rows"]} >= {"published", "drafter"}
    # one server at a time, and the drafter's unit restarted with our checkpoint after the published one
    assert (tmp_path / "server-commands.log").read_text().splitlines() == [
        "stop baseline (running: baseline )", "start third (running: )",
        "stop drafter (running: drafter )", "start drafter (running: )",
        "stop drafter (running: drafter )", "start baseline (running: )"]
    assert sorted(os.listdir(tmp_path / "servers")) == ["baseline"]


def test_a_bad_plan_is_refused_before_anything_runs(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"baseline": {"run_id": "b", "argv": ["x"]}}))
    proc = pair(tmp_path / "w", plan)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "the server switch must be a JSON object" in out
    assert not (tmp_path / "w" / "runs").exists()

