"""The bench stage for real: the tiny verifier served by the stand-in, first alone, then with the trained
drafter, then with the untrained one; `python -m backend.bench` measures each on the same prompts and
compares with the baseline run. The trained drafter is accepted well and its comparison is stored; the
untrained one is flagged slower (exit 3) with its poor acceptance."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.sim_support import REPO, SimServer
from harness.specdec_support import env

pytestmark = pytest.mark.timeout(600)
MODEL = "kimi"


@pytest.fixture(scope="module")
def bench_env(tiny_drafters, tmp_path_factory):
    from sim.tinycorpus import demo_questions

    root = tmp_path_factory.mktemp("bench")
    prompts = root / "prompts.jsonl"
    # the demo's questions, asked the way an operator's dataset would (ShareGPT rows)
    rows = [{"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": "-"}]}
            for q in demo_questions(72)[24:]]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, prompts


def serve(tiny_drafters, tmp_path_factory, drafter=None) -> SimServer:
    args = ["--text-backend", "tinylm", "--served-model-name", MODEL, "--stats-interval", "60"]
    if drafter is not None:
        args += ["--speculative-config", json.dumps({"method": "eagle3", "model": str(drafter),
                                                     "num_speculative_tokens": 3})]
    sim = SimServer(tmp_path_factory.mktemp("benchsim"), *args,
                    env={"XDG_CACHE_HOME": str(tiny_drafters.xdg), "HF_HUB_OFFLINE": "1"}).start()
    return sim.wait_ready(timeout=120)


def bench(tmp_path_factory, root, prompts, sim, run_id, label, *extra) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "backend.bench", "--work-dir", str(root), "--run-id", run_id,
           "--endpoint", sim.url, "--model", MODEL, "--prompts", str(prompts), "--label", label,
           "--num-prompts", "6", "--max-tokens", "96", "--temperature", "0", "--client", "ours", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env(tmp_path_factory), timeout=300)


def summary(root, run_id) -> dict:
    return json.loads((root / "runs" / run_id / "summary.json").read_text())


def finish_event(root, run_id) -> dict:
    lines = (root / "runs" / run_id / "events.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


def test_trained_drafter_against_baseline_then_untrained_flagged(tiny_drafters, tmp_path_factory, bench_env):
    root, prompts = bench_env
    sim = serve(tiny_drafters, tmp_path_factory)
    try:
        base = bench(tmp_path_factory, root, prompts, sim, "bench-base", "baseline", "--concurrency", "1,2")
    finally:
        sim.terminate()
    assert base.returncode == 0, base.stdout + base.stderr
    b = summary(root, "bench-base")
    assert [lv["concurrency"] for lv in b["result"]["levels"]] == [1, 2]
    assert all(lv["acceptance"] is None and lv["completed"] == 6 for lv in b["result"]["levels"])
    assert b["result"]["server"]["spec_decode"] is False and "comparison" not in b

    sim = serve(tiny_drafters, tmp_path_factory, tiny_drafters.trained)
    try:
        drafted = bench(tmp_path_factory, root, prompts, sim, "bench-drafter", "drafter", "--concurrency", "1,2",
                        "--baseline-run", "bench-base")
    finally:
        sim.terminate()
    d = summary(root, "bench-drafter")
    assert drafted.returncode == (3 if d["slower"] else 0), drafted.stdout + drafted.stderr
    assert finish_event(root, "bench-drafter")["summary"]["comparison"] == d["comparison"]
    rows = [r for r in d["comparison"]["rows"] if r["label"] == "drafter"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    assert all(r["acceptance_length"] > 1.6 and r["acceptance_rate"] > 0.2 for r in rows), rows
    assert d["result"]["server"]["spec_decode"] is True
    # same prompts, greedy: the drafter changes the speed, never the tokens
    assert d["result"]["workload"]["digest"] == b["result"]["workload"]["digest"]
    assert [lv["total_output_tokens"] for lv in d["result"]["levels"]] == \
           [lv["total_output_tokens"] for lv in b["result"]["levels"]]
    assert "vs baseline" in drafted.stdout and "drafter" in drafted.stdout

    sim = serve(tiny_drafters, tmp_path_factory, tiny_drafters.untrained)
    try:
        poor = bench(tmp_path_factory, root, prompts, sim, "bench-untrained", "untrained", "--concurrency", "1",
                     "--baseline-run", "bench-base")
    finally:
        sim.terminate()
    assert poor.returncode == 3, poor.stdout + poor.stderr
    u = summary(root, "bench-untrained")
    row = next(r for r in u["comparison"]["rows"] if r["label"] == "untrained")
    assert row["slower"] and row["ratio"] < 1 and row["acceptance_length"] < 1.3
    assert "SLOWER" in poor.stdout and u["comparison"]["missing"] == ["concurrency 2: not measured by untrained"]


def test_bench_refuses_bad_input_and_a_dead_server(tmp_path_factory, bench_env, tmp_path):
    root, prompts = bench_env

    class Down:
        url = "http://127.0.0.1:9"

    bad = bench(tmp_path_factory, tmp_path, prompts, Down, "b1", "base line")
    assert bad.returncode == 2 and "--label 'base line'" in bad.stderr and not (tmp_path / "runs").exists()
    missing = bench(tmp_path_factory, tmp_path, prompts, Down, "b1", "drafter", "--baseline-run", "nope")
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr and not (tmp_path / "runs" / "b1").exists()
    down = bench(tmp_path_factory, tmp_path, prompts, Down, "b2", "baseline", "--ready-timeout", "1")
    assert down.returncode == 1 and "did not answer within 1 s" in down.stderr
    assert finish_event(tmp_path, "b2")["status"] == "failed"


def test_sigterm_stops_the_bench_and_keeps_the_measured_levels(tmp_path):
    """A bench stopped midway finishes its events as stopped (exit 0) with what it measured; started again
    with the same run id it measures only the level that is missing."""
    import signal
    import time

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                               for i in range(4)))
    sim = SimServer(tmp_path, "--served-model-name", MODEL, "--response-tokens", "40", "--latency-per-token",
                    "0.03").start().wait_ready()
    try:
        cmd = [sys.executable, "-m", "backend.bench", "--work-dir", str(tmp_path), "--run-id", "b", "--endpoint",
               sim.url, "--model", MODEL, "--prompts", str(prompts), "--concurrency", "1,2", "--num-prompts", "4",
               "--max-tokens", "40", "--client", "ours"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        results = tmp_path / "runs" / "b" / "bench.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (results.exists() and json.loads(results.read_text())["levels"]):
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        finish = finish_event(tmp_path, "b")
        assert finish["status"] == "stopped" and "bench: stopped" in out
        assert [lv["concurrency"] for lv in json.loads(results.read_text())["levels"]] == [1]
        again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stdout
        done = summary(tmp_path, "b")
        assert [lv["concurrency"] for lv in done["result"]["levels"]] == [1, 2] and done["status"] == "completed"
    finally:
        sim.kill()
