"""backend/benchpair.py's own guarantees, with real processes: whatever happens to a bench (it fails, it
is stopped with SIGTERM), the drafter server is stopped and the baseline serves again at the end, and
the drafter server never starts while the baseline still runs. The two servers here are marker files
handled by the plan's commands (a service manager reduced to `touch`/`rm`/`test`); the benches are the
real bench program, against the stand-in."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.sim_support import REPO, SimServer

pytestmark = pytest.mark.timeout(300)
MODEL = "tiny"


def plan_for(tmp_path: Path, baseline_argv: list[str], drafter_argv: list[str] | None = None,
             third_argv: list[str] | None = None, *, endpoint: str, lock: str = "",
             k_argvs: dict[int, list[str]] | None = None) -> Path:
    """A pair plan as console/control/bench_pair.py writes one: the drafter (or the drafter at each K of
    `k_argvs`: servers drafter_k2, ...), a published drafter first when `third_argv`, all in the drafter's
    unit."""
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
        return {"name": name, "unit": unit, "start": cmd(name, "start", unit), "stop": cmd(unit, "stop"),
                "alive": cmd(unit, "alive")}

    def contender(name: str, run_id: str, argv: list[str], title: str, k: int, ours: bool = True) -> dict:
        return {"server": name, "run_id": run_id, "argv": argv, "title": title, "k": k, "ours": ours}

    # the published drafter: the drafter server's unit, another checkpoint
    contenders = [contender("third", "p-third", third_argv, "published drafter", 3, False)] if third_argv else []
    if k_argvs:
        contenders += [contender(f"drafter_k{k}", f"p-k{k}", argv, f"drafter (K={k})", k) for k, argv in k_argvs.items()]
    else:
        contenders.append(contender("drafter", "p-drafter", drafter_argv or [], "drafter", 3))
    plan = {"checkpoint": "/ck", "baseline": {"server": "baseline", "run_id": "p-baseline", "argv": baseline_argv},
            "contenders": contenders,
            "switch": {"version": 1, "home": server("baseline", "baseline"),
                       "away": [server(c["server"], "drafter") for c in contenders], "endpoint": endpoint,
                       "ready_timeout_s": 30, "command_timeout_s": 30, "stop_check_s": 10, "lock_path": lock}}
    if third_argv:
        plan.update(third_checkpoint="/published")
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


def stopped_pair(tmp_path: Path, work: Path, bench_run: str, latency: str, make_plan) -> dict:
    """Start the pair against a stand-in answering `latency` s per token (the baseline serving), SIGTERM
    it once `bench_run` (a contender's bench) has begun, and return its summary; it exits 0."""
    sim = SimServer(tmp_path, "--served-model-name", MODEL, "--response-tokens", "20", "--latency-per-token",
                    latency).start().wait_ready()
    try:
        plan = make_plan(sim.url)
        (tmp_path / "servers" / "baseline").touch()  # the baseline serves when the bench starts
        proc = pair(work, plan)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (work / "runs" / bench_run / "events.jsonl").exists():
            time.sleep(0.1)
        assert (tmp_path / "servers" / "drafter").exists()  # swapped: the drafter server is being benched
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        sim.kill()
    assert proc.returncode == 0, out
    return json.loads((work / "runs" / "p" / "summary.json").read_text())


def test_sigterm_stops_the_drafter_bench_and_swaps_back(tmp_path, prompts):
    work = tmp_path / "w"
    summary = stopped_pair(tmp_path, work, "p-drafter", "0.2", lambda url: plan_for(
        tmp_path, bench_argv(work, prompts, url, "p-baseline", "baseline"),
        bench_argv(work, prompts, url, "p-drafter", "drafter", "--baseline-run", "p-baseline"), endpoint=url))
    assert summary["status"] == "stopped"
    assert sorted(os.listdir(tmp_path / "servers")) == ["baseline"]
    assert (tmp_path / "server-commands.log").read_text().splitlines() == [
        "stop baseline (running: baseline )", "start drafter (running: )",
        "stop drafter (running: drafter )", "start baseline (running: )"]
    finish = json.loads((work / "runs" / "p-drafter" / "events.jsonl").read_text().splitlines()[-1])
    assert finish["kind"] == "finish" and finish["status"] == "stopped"


def completed_pair(tmp_path: Path, work: Path, make_plan, *sim_args: str) -> tuple[int, str, dict]:
    """Run the pair to its end against a stand-in (the baseline serving at the start): (exit, output,
    summary); `make_plan(url)` writes its plan."""
    sim = SimServer(tmp_path, "--served-model-name", MODEL, "--response-tokens", "8", *sim_args).start().wait_ready()
    try:
        plan = make_plan(sim.url)
        (tmp_path / "servers" / "baseline").touch()
        proc = pair(work, plan)
        out, _ = proc.communicate(timeout=240)
    finally:
        sim.kill()
    assert proc.returncode in (0, 3), out
    return proc.returncode, out, json.loads((work / "runs" / "p" / "summary.json").read_text())


def test_a_third_contender_is_benched_in_the_drafters_unit_and_compared_in_one_table(tmp_path, prompts):
    work = tmp_path / "w"
    _, _, summary = completed_pair(tmp_path, work, lambda url: plan_for(
        tmp_path, bench_argv(work, prompts, url, "p-baseline", "baseline"),
        bench_argv(work, prompts, url, "p-drafter", "drafter", "--baseline-run", "p-baseline", "--third-run", "p-third"),
        bench_argv(work, prompts, url, "p-third", "published", "--baseline-run", "p-baseline"), endpoint=url))
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


def test_the_pair_carries_our_drafters_reference_line_and_reasoning_answer_split(tmp_path, prompts):
    from console.telemetry.bench_view import summary_notes

    work = tmp_path / "w"
    # the stand-in's SIMULATED drafter, served a step at a time: its counters grow as vLLM's do
    _, _, summary = completed_pair(tmp_path, work, lambda url: plan_for(
        tmp_path, bench_argv(work, prompts, url, "p-baseline", "baseline"),
        bench_argv(work, prompts, url, "p-drafter", "drafter", "--baseline-run", "p-baseline",
                   "--reference-acceptance", "2.88", "--reference-k", "3", "--split-prompts", "2"),
        endpoint=url), "--drafter", "/nothing/there", "--acceptance", "1,1,0", "--latency-per-token", "0.001",
        "--response-tokens", "60")
    assert summary["status"] == "completed"
    assert summary["reference"]["length"] == 2.88 and summary["reference"]["label"] == "drafter"
    assert summary["phases"]["label"] == "drafter" and summary["phases"]["requests"] == 2
    notes = summary_notes(summary)
    assert notes[0].startswith("reference 2.88 (K=3); drafter ") and notes[0].endswith("of the reference")
    assert notes[1].startswith("acceptance by phase (drafter, 2 requests one at a time): reasoning ")


def test_a_bad_plan_is_refused_before_anything_runs(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"baseline": {"run_id": "b", "argv": ["x"]}}))
    proc = pair(tmp_path / "w", plan)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "the server switch must be a JSON object" in out
    assert not (tmp_path / "w" / "runs").exists()



def k_argvs(work: Path, prompts: Path, url: str, *ks: int) -> dict[int, list[str]]:
    return {k: bench_argv(work, prompts, url, f"p-k{k}", f"drafter-k{k}", "--baseline-run", "p-baseline") for k in ks}


def test_several_k_are_benched_one_drafter_start_each_and_the_best_is_named(tmp_path, prompts):
    work = tmp_path / "w"
    code, out, summary = completed_pair(tmp_path, work, lambda url: plan_for(
        tmp_path, bench_argv(work, prompts, url, "p-baseline", "baseline"),
        k_argvs=k_argvs(work, prompts, url, 2, 3), endpoint=url))
    assert summary["status"] == "completed" and summary["runs"] == {
        "baseline": "p-baseline", "drafter_k2": "p-k2", "drafter_k3": "p-k3"}
    assert [s["step"] for s in summary["steps"] if s["ok"]] == [
        "baseline serving", "bench baseline", "swap to the drafter (K=2)", "bench drafter (K=2)",
        "swap to the drafter (K=3)", "bench drafter (K=3)", "back to the baseline"]
    # one table of the baseline against each K, and the best of them by mean speed-up
    cmp = summary["comparison"]
    assert cmp["labels"] == ["baseline", "drafter-k2", "drafter-k3"]
    ratio = {r["label"]: r["ratio"] for r in cmp["rows"]}
    best = summary["best_k"]
    assert summary["k_values"] == [2, 3] and best["k"] == max((2, 3), key=lambda k: (ratio[f"drafter-k{k}"], -k))
    assert best["label"] == f"drafter-k{best['k']}" and best["speedup"] == round(ratio[best["label"]], 3)
    assert summary["slower"] == best["slower"] == (ratio[best["label"]] < 1) and code == 3 * summary["slower"]
    assert f"best K {best['k']}" in out
    # one server at a time: the drafter's unit restarted for each K, the baseline back at the end
    assert (tmp_path / "server-commands.log").read_text().splitlines() == [
        "stop baseline (running: baseline )", "start drafter_k2 (running: )",
        "stop drafter (running: drafter )", "start drafter_k3 (running: )",
        "stop drafter (running: drafter )", "start baseline (running: )"]
    assert sorted(os.listdir(tmp_path / "servers")) == ["baseline"]


def test_sigterm_during_the_second_k_swaps_back_and_keeps_the_first_k_measured(tmp_path, prompts):
    work = tmp_path / "w"
    summary = stopped_pair(tmp_path, work, "p-k4", "0.05", lambda url: plan_for(
        tmp_path, bench_argv(work, prompts, url, "p-baseline", "baseline"),
        k_argvs=k_argvs(work, prompts, url, 2, 4), endpoint=url))
    assert summary["status"] == "stopped" and summary["steps"][-1] == {"step": "back to the baseline", "ok": True}
    assert sorted(os.listdir(tmp_path / "servers")) == ["baseline"]
    assert (tmp_path / "server-commands.log").read_text().splitlines()[-2:] == [
        "stop drafter (running: drafter )", "start baseline (running: )"]
    # K=2 was measured: it is compared and named; K=4 stopped mid-bench is not
    assert summary["comparison"]["labels"] == ["baseline", "drafter-k2"] and summary["best_k"]["k"] == 2


@pytest.mark.parametrize("change, says", [
    (lambda p: p.pop("contenders"), "contenders must be a list of 1 to"),
    (lambda p: p["contenders"].append(dict(p["contenders"][0])), "the benches' run_ids repeat"),
    (lambda p: [c.update(ours=False) for c in p["contenders"]], "no contender is ours"),
    (lambda p: p["contenders"][0].update(k=0), "contenders[0].k must be a positive integer"),
    (lambda p: p["contenders"][0].update(server="nope"), "contenders[0]: the switch has no 'nope' server"),
])
def test_a_plan_whose_contenders_do_not_add_up_is_refused(tmp_path, change, says):
    path = plan_for(tmp_path, ["true"], k_argvs={2: ["true"], 3: ["true"]}, endpoint="http://127.0.0.1:9")
    plan = json.loads(path.read_text())
    change(plan)
    path.write_text(json.dumps(plan))
    proc = pair(tmp_path / "w", path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and says in out, out
    assert not (tmp_path / "w" / "runs").exists() and not (tmp_path / "server-commands.log").exists()


def test_the_pair_and_each_bench_record_the_server_command_lines(tmp_path, prompts):
    """Provenance (issue 31 item 7): the pair records each server's command line from its plan (redacted),
    and each bench records the one of the process it really benched (the stand-in listening on the
    endpoint, visible to this user), or the plan's where the listener cannot be seen."""
    work = tmp_path / "w"

    def make(url: str) -> Path:
        path = plan_for(tmp_path, bench_argv(work, prompts, url, "p-baseline", "baseline"),
                        bench_argv(work, prompts, url, "p-drafter", "drafter", "--baseline-run", "p-baseline"),
                        endpoint=url)
        plan = json.loads(path.read_text())
        plan["switch"]["home"]["command"] = ["vllm", "serve", "/models/kimi", "--api-key", "sk-secret"]
        plan["switch"]["away"][0]["command"] = ["vllm", "serve", "/models/kimi", "--speculative-config", "{}"]
        path.write_text(json.dumps(plan))
        return path

    _, _, summary = completed_pair(tmp_path, work, make)
    assert summary["status"] == "completed"
    assert summary["host"]["servers"] == {
        "baseline": ["vllm", "serve", "/models/kimi", "--api-key", "***"],
        "drafter": ["vllm", "serve", "/models/kimi", "--speculative-config", "{}"]}
    for leg in ("p-baseline", "p-drafter"):
        host = json.loads((work / "runs" / leg / "summary.json").read_text())["host"]
        assert host["server_command"][1:3] == ["-m", "sim.vllm_server"]  # the listener's own argv
    assert "sk-secret" not in (work / "runs" / "p" / "events.jsonl").read_text()
