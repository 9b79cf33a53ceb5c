"""Switching servers: `run serve-drafter` stops the baseline and serves the verified drafter as
`<unit>-drafter`, `run serve-baseline` brings the baseline back; one server at a time, checked on the
host. On the demo host for real (its tmux sessions and the processes in them), with the host-side
choice of checkpoint (backend/kit/servable.py) and the parsers of the service manager's answer."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.contract.events import EventLog
from backend.contract.lookup import InputError
from backend.contract.runs import Manifest, open_run_dir
from backend.kit.servable import servable
from console.control.drafter_server import drafter_command, live_servers_argv, parse_live_servers
from console.control.server_argv import server_command
from console.profile import load_profile, profile_from_dict

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parent.parent


def finished_run(work: Path, stage: str, run_id: str, outputs: dict, status: str = "completed", **extra) -> Path:
    """A run directory as a stage leaves it: manifest, start and finish events, summary."""
    run = open_run_dir(str(work), run_id, Manifest(stage=stage, run_id=run_id, identity={"n": run_id}))
    events = EventLog(run.events_path, stage, run_id)
    events.emit("start", total=1, manifest=run.manifest.to_dict())
    summary = {"stage": stage, "run_id": run_id, "ok": status == "completed", "outputs": outputs, **extra}
    run.write_summary(summary)
    events.emit("finish", status=status, summary=summary)
    events.close()
    return Path(run.path)


# ---- the host's choice of checkpoint ------------------------------------------------------------------------
def test_servable_takes_the_latest_verified_checkpoint(tmp_path):
    with pytest.raises(InputError, match="no verified drafter: no completed verify run"):
        servable(str(tmp_path))
    a, b = tmp_path / "ck-a", tmp_path / "ck-b"
    a.mkdir(), b.mkdir()
    finished_run(tmp_path, "train", "train-1", {"checkpoint": str(a)})
    finished_run(tmp_path, "verify", "verify-1", {"checkpoint": str(a)})
    time.sleep(0.02)
    finished_run(tmp_path, "verify", "verify-2", {"checkpoint": str(b)})
    finished_run(tmp_path, "verify", "verify-3", {"checkpoint": str(b)}, status="failed")
    assert servable(str(tmp_path)).checkpoint == str(b)
    assert servable(str(tmp_path), "verify-1").checkpoint == str(a)
    # a train run: its checkpoint, vouched for by the verify run that verified it
    found = servable(str(tmp_path), "train-1")
    assert (found.checkpoint, found.run_id, found.stage) == (str(a), "verify-1", "train")
    finished_run(tmp_path, "train", "train-2", {"checkpoint": str(tmp_path / "ck-c")})
    with pytest.raises(InputError, match=r"train run train-2's checkpoint .* has not been verified: run `verify "
                                         r"--input train-2` first"):
        servable(str(tmp_path), "train-2")
    with pytest.raises(InputError, match="verify run verify-3 failed"):
        servable(str(tmp_path), "verify-3")
    finished_run(tmp_path, "prepare", "prep-1", {})
    with pytest.raises(InputError, match="run 'prep-1' is a prepare run"):
        servable(str(tmp_path), "prep-1")
    with pytest.raises(InputError, match="no run 'nope'"):
        servable(str(tmp_path), "nope")


def test_a_published_drafter_is_benched_as_the_third_never_served_by_default(tmp_path):
    from backend.kit.servable import third

    ours, published = tmp_path / "ck-ours", tmp_path / "ck-published"
    ours.mkdir(), published.mkdir()
    with pytest.raises(InputError, match="no published drafter fetched: run `fetch-drafter` first"):
        third(str(tmp_path))
    finished_run(tmp_path, "verify", "verify-ours", {"checkpoint": str(ours)}, external_checkpoint=False)
    finished_run(tmp_path, "fetch_drafter", "fetch-1", {"checkpoint": str(published)})
    with pytest.raises(InputError, match=r"has not been verified: run `verify --checkpoint .*ck-published` first"):
        third(str(tmp_path))
    time.sleep(0.02)
    # verified with `run verify --checkpoint`, after ours: still not what serve-drafter picks
    finished_run(tmp_path, "verify", "verify-published", {"checkpoint": str(published)}, external_checkpoint=True)
    assert servable(str(tmp_path)).checkpoint == str(ours)
    found = third(str(tmp_path))
    assert (found.checkpoint, found.run_id, found.stage) == (str(published), "verify-published", "fetch_drafter")


def test_live_servers_parsed_from_systemd_and_tmux():
    sd = profile_from_dict({"host": {"name": "gpu-host.example"}, "server": {"model_path": "/m", "unit": "vllm-k"},
                            "paths": {"work_dir": "/w"}})
    assert live_servers_argv(sd) == ["systemctl", "show", "vllm-k", "vllm-k-drafter", "-p", "Id,ActiveState"]
    show = "Id=vllm-k.service\nActiveState=inactive\n\nId=vllm-k-drafter.service\nActiveState=activating\n"
    assert parse_live_servers(sd, show) == {"drafter"}
    assert parse_live_servers(sd, show.replace("inactive", "active")) == {"baseline", "drafter"}
    assert parse_live_servers(sd, "Id=vllm-k-drafter.service\nActiveState=failed\n") == set()
    tm = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                            "server": {"model_path": "/m", "unit": "demo", "manager": "tmux"},
                            "paths": {"work_dir": "/w"}})
    panes = "demo 1\ndemo-drafter 0\ndemo-drafter-x 0\ne3-train-1 0\n"
    assert parse_live_servers(tm, panes) == {"drafter"}
    assert parse_live_servers(tm, "demo 0\n") == {"baseline"}


# ---- on the demo host ---------------------------------------------------------------------------------------
def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL)


def session_argv(work: Path, session: str) -> list[str] | None:
    """The argv of the program running in a demo tmux session (the child of the pane's wrapper), or None."""
    env = {**os.environ, "TMUX_TMPDIR": str(work / "tmux")}
    env.pop("TMUX", None)
    res = subprocess.run(["tmux", "list-panes", "-t", f"={session}:", "-F", "#{pane_pid} #{pane_dead}"], env=env,
                         capture_output=True, text=True, timeout=30)
    if res.returncode != 0 or not res.stdout.strip().endswith(" 0"):
        return None
    pane = res.stdout.split()[0]
    children = subprocess.run(["ps", "--ppid", pane, "-o", "pid=,args="], capture_output=True, text=True,
                              timeout=30).stdout.splitlines()
    for line in children:
        pid = line.split()[0]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        if b"tail" not in argv[0]:
            return [a.decode() for a in argv]
    return None


async def baseline_actions(profile):
    from console.control.launch import StageRequest
    from console.session import Session

    async with Session(profile) as session:
        await session.settle()
        started, _ = await session.launch_stage(StageRequest("serve"))
        return [started, await session.restart_server()]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    work = tmp_path_factory.mktemp("serve") / "demo"
    started = cli("demo-host", "start", "--dir", str(work), "--speed", "10")
    assert started.returncode == 0, started.stderr
    profile = started.stdout.strip()
    try:
        assert cli("wait-ready", "--profile", profile, "--timeout", "120").returncode == 0
        yield work, profile
    finally:
        cli("demo-host", "stop", "--dir", str(work))


def test_switch_to_the_drafter_and_back(demo):
    work, path = demo
    profile = load_profile(path)
    unit = profile.server.unit
    baseline_argv = session_argv(work, unit)
    # the demo's command starts `env PYTHONPATH=... python ...`: env execs the python
    assert baseline_argv == server_command(profile)[2:]

    asked = cli("run", "serve-drafter", "--profile", path)
    assert asked.returncode == 2 and "pass --yes" in asked.stderr
    # this process attached to a server already up: it measured no load (it used to claim "about 0 s")
    assert "costs 1 server load" in asked.stderr and "about 0 s" not in asked.stderr, asked.stderr
    none = cli("run", "serve-drafter", "--profile", path, "--yes")
    assert none.returncode == 1 and "no verified drafter" in none.stderr, none.stderr
    assert session_argv(work, unit) == baseline_argv  # refused before anything was stopped

    # a SIMULATED drafter (a directory without a checkpoint: the stand-in makes its acceptance up), verified
    ckpt = work / "runs-ck" / "checkpoint_best"
    ckpt.mkdir(parents=True)
    finished_run(work, "verify", "verify-1", {"checkpoint": str(ckpt)})
    on = cli("run", "serve-drafter", "--profile", path, "--yes", "--wait")
    assert on.returncode == 0, on.stdout + on.stderr
    assert "ready with the drafter: drafter loaded, auxiliary layers" in on.stdout, on.stdout
    assert session_argv(work, unit) is None
    assert session_argv(work, f"{unit}-drafter") == drafter_command(profile, str(ckpt))[2:]
    status = json.loads(cli("status", "--profile", path, "--json").stdout)
    assert status["service"]["unit"] == f"{unit}-drafter" and status["server"]["phase"] == "ready"
    assert status["server"]["drafter"]["loaded"] is True and status["server"]["drafter"]["unit"] == f"{unit}-drafter"

    again = cli("run", "serve-drafter", "--profile", path, "--yes")
    assert again.returncode == 1 and "already running" in again.stderr
    # one server at a time: the baseline is not started (nor restarted) beside the drafter server
    refused = asyncio.run(baseline_actions(profile))
    assert all(not r.ok and "the drafter server runs in" in r.message for r in refused), refused
    assert session_argv(work, unit) is None

    off = cli("run", "serve-baseline", "--profile", path, "--yes", "--wait")
    assert off.returncode == 0, off.stdout + off.stderr
    assert session_argv(work, f"{unit}-drafter") is None
    assert session_argv(work, unit) == baseline_argv
    status = json.loads(cli("status", "--profile", path, "--json").stdout)
    assert status["service"]["unit"] == unit and status["server"]["phase"] == "ready"
    assert status["server"]["drafter"] is None


def test_a_gone_session_is_never_mistaken_for_a_longer_named_one(tmp_path):
    """tmux 3.3a resolves `list-panes -t =vllm` to `vllm-drafter` when `vllm` is gone: the stop of the
    baseline must not kill the drafter server, nor the baseline's probe report the drafter's pane."""
    from console.control.units import tmux_stop_argv
    from console.telemetry.probe import service_argv

    (tmp_path / "tmux").mkdir(mode=0o700)
    env = {**os.environ, "TMUX_TMPDIR": str(tmp_path / "tmux")}
    env.pop("TMUX", None)
    subprocess.run(["tmux", "new-session", "-d", "-s", "e3v-drafter", "sleep", "300"], env=env, check=True, timeout=30)
    try:
        p = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                               "server": {"model_path": "/m", "unit": "e3v", "manager": "tmux"},
                               "paths": {"work_dir": str(tmp_path)}})
        probe = subprocess.run(service_argv(p)[0], env=env, capture_output=True, text=True, timeout=30)
        assert probe.returncode != 0 and "e3v-drafter" not in probe.stdout
        stop = subprocess.run(tmux_stop_argv("e3v", 5), env=env, capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0
        alive = subprocess.run(["tmux", "has-session", "-t", "=e3v-drafter"], env=env, timeout=30)
        assert alive.returncode == 0
    finally:
        subprocess.run(["tmux", "kill-server"], env=env, capture_output=True, timeout=30)


def bench_ready(demo) -> tuple[Path, str, object]:
    """The demo host set up for a short bench (its own prompts, 4 of them, concurrency 1) of a verified
    SIMULATED drafter: (work dir, profile path, profile)."""
    from console.profile import write_profile

    work, path = demo
    profile = load_profile(path)
    profile.bench.dataset = str(work / "data" / "demo-prompts.jsonl")
    profile.bench.num_prompts, profile.bench.concurrency, profile.bench.max_tokens = 4, [1], 24
    write_profile(profile, Path(path), overwrite=True)
    if not (work / "runs" / "verify-1").exists():  # the switch test made it; alone, make it here
        ckpt = work / "runs-ck" / "checkpoint_best"
        ckpt.mkdir(parents=True, exist_ok=True)
        finished_run(work, "verify", "verify-1", {"checkpoint": str(ckpt)})
    return work, path, profile


def test_bench_pair_on_the_demo_host(demo):
    """`run bench --wait`: one detached program benches the baseline, swaps to the drafter server, benches
    it against the baseline, and swaps back; the table and the exit status say whether it is slower."""
    work, path, profile = bench_ready(demo)
    asked = cli("run", "bench", "--profile", path)
    assert asked.returncode == 2 and "pass --yes" in asked.stderr
    done = cli("run", "bench", "--profile", path, "--run-id", "pair", "--yes", "--wait", timeout=600)
    summary = json.loads((work / "runs" / "pair" / "summary.json").read_text())
    assert done.returncode == (3 if summary["slower"] else 0), done.stdout[-3000:] + done.stderr[-3000:]
    assert summary["status"] == "completed" and summary["runs"] == {"baseline": "pair-baseline",
                                                                     "drafter": "pair-drafter"}
    assert [s["step"] for s in summary["steps"]] == ["baseline serving", "bench baseline", "swap to the drafter",
                                                     "bench drafter", "back to the baseline"]
    assert all(s["ok"] for s in summary["steps"])
    drafter = json.loads((work / "runs" / "pair-drafter" / "summary.json").read_text())
    assert drafter["result"]["server"]["spec_decode"] is True and summary["comparison"] == drafter["comparison"]
    baseline = json.loads((work / "runs" / "pair-baseline" / "summary.json").read_text())
    assert baseline["result"]["server"]["spec_decode"] is False
    assert "vs baseline" in done.stdout and "drafter" in done.stdout  # the table
    # back to the baseline: its session runs the baseline's own command line, the drafter's is gone
    assert session_argv(work, f"{profile.server.unit}-drafter") is None
    assert session_argv(work, profile.server.unit) == server_command(profile)[2:]
    # the console shows the pair run as a bench: the comparison side by side (the bench pane's view)
    from console.telemetry.bench_view import bench_view
    from console.snapshot import RunInfo

    status = json.loads(cli("status", "--profile", path, "--json").stdout)
    run = next(RunInfo(**r) for r in status["runs"] if r["run_id"] == "pair")
    view = bench_view(run)
    assert view.state == "done" and view.baseline == "baseline" and view.error is None
    assert [(r.concurrency, r.label) for r in view.rows] == [(1, "baseline"), (1, "drafter")]
    assert view.slower == summary["slower"] and status["server"]["drafter"] is None


def test_bench_of_two_k_on_the_demo_host(demo):
    """`run bench --k 2,3 --wait`: one detached program benches the baseline, then the drafter server
    started at K=2 and again at K=3 (its speculative config's num_speculative_tokens, which the stand-in's
    /metrics count per position as vLLM's do), one table of the three and the best K named; a K past the
    one the drafter was trained for is refused before any server stops."""
    work, path, profile = bench_ready(demo)
    asked = cli("run", "bench", "--profile", path, "--k", "2,3", "--input", "verify-1")
    assert asked.returncode == 2 and "pass --yes" in asked.stderr
    assert "2 drafter server starts (K=2, K=3) and the baseline's restart: 3 server loads" in asked.stderr, asked.stderr
    # a drafter trained for K=3 (its config.json says so) is not benched at K=4
    trained3 = work / "runs-ck" / "trained-k3"
    trained3.mkdir(parents=True, exist_ok=True)
    (trained3 / "config.json").write_text(json.dumps({"speculators_config": {"proposal_methods": [
        {"proposal_type": "greedy", "speculative_tokens": 3}]}}))
    finished_run(work, "verify", "verify-k3", {"checkpoint": str(trained3)})
    over = cli("run", "bench", "--profile", path, "--k", "2,4", "--input", "verify-k3", "--yes")
    assert over.returncode == 1 and "--k [2, 4]: the drafter" in over.stderr and "trained for K=3" in over.stderr
    assert not (work / "runs" / "ks").exists() and session_argv(work, f"{profile.server.unit}-drafter") is None

    done = cli("run", "bench", "--profile", path, "--k", "2,3", "--input", "verify-1", "--run-id", "ks", "--yes",
               "--wait", timeout=600)
    summary = json.loads((work / "runs" / "ks" / "summary.json").read_text())
    assert done.returncode == (3 if summary["slower"] else 0), done.stdout[-3000:] + done.stderr[-3000:]
    assert summary["status"] == "completed" and summary["runs"] == {
        "baseline": "ks-baseline", "drafter_k2": "ks-k2", "drafter_k3": "ks-k3"}
    assert [s["step"] for s in summary["steps"] if s["ok"]] == [
        "baseline serving", "bench baseline", "swap to the drafter (K=2)", "bench drafter (K=2)",
        "swap to the drafter (K=3)", "bench drafter (K=3)", "back to the baseline"]
    # each K really served: the drafter server's /metrics counted K draft positions per step
    for k in (2, 3):
        bench = json.loads((work / "runs" / f"ks-k{k}" / "summary.json").read_text())
        acc = bench["result"]["levels"][0]["acceptance"]
        assert len(acc["per_position"]) == k and acc["draft_tokens"] == k * acc["drafts"], acc
    assert summary["comparison"]["labels"] == ["baseline", "drafter-k2", "drafter-k3"]
    best = summary["best_k"]
    assert best["k"] in (2, 3) and f"best K: {best['k']} (drafter-k{best['k']}" in done.stdout, done.stdout[-2000:]
    assert session_argv(work, f"{profile.server.unit}-drafter") is None
    assert session_argv(work, profile.server.unit) == server_command(profile)[2:]
    # the bench pane's view: one table of the three, the best K named
    from console.snapshot import RunInfo
    from console.telemetry.bench_view import bench_view
    from console.ui.panes.bench import bench_markup

    status = json.loads(cli("status", "--profile", path, "--json").stdout)
    view = bench_view(next(RunInfo(**r) for r in status["runs"] if r["run_id"] == "ks"))
    assert [r.label for r in view.rows] == ["baseline", "drafter-k2", "drafter-k3"] and view.best.k == best["k"]
    assert f"best K: {best['k']}" in bench_markup(view).plain


# ---- the trained drafter, for real on the demo host -----------------------------------------------------------
async def live_drafter_snapshot(profile, seconds: float = 40.0):
    """Follow the demo host while a few chats run on its server: the snapshot once /metrics acceptance (two
    scrapes) and a SpecDecoding metrics log line are both in, or the last one."""
    import httpx

    from console.session import Session

    async def chats() -> None:
        from sim.tinycorpus import DEMO_ASKS, DEMO_TOPICS

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{profile.server.port}", timeout=60) as http:
            for i in range(60):
                body = {"model": profile.server.model_id, "max_tokens": 48, "temperature": 0,
                        "messages": [{"role": "user", "content": DEMO_ASKS[i % len(DEMO_ASKS)].format(
                            t=DEMO_TOPICS[i % len(DEMO_TOPICS)])}]}
                (await http.post("/v1/chat/completions", json=body)).raise_for_status()

    snap = None
    async with Session(profile, interval=1.0) as session:
        load = asyncio.create_task(chats())
        try:
            deadline = asyncio.get_running_loop().time() + seconds
            async for snap in session.snapshots(connecting=False):
                m, d = snap.server.metrics, snap.server.drafter
                if (m is not None and m.spec_mean_acceptance_length is not None and d is not None
                        and d.log_stats is not None) or asyncio.get_running_loop().time() > deadline:
                    break
        finally:
            load.cancel()
    return snap


def test_the_trained_drafter_served_on_the_demo_host(tiny_drafters, tmp_path_factory):
    env = {**os.environ, "XDG_CACHE_HOME": str(tiny_drafters.xdg), "HF_HUB_OFFLINE": "1"}

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL, env=env)

    work = tmp_path_factory.mktemp("served") / "demo"
    started = run("demo-host", "start", "--dir", str(work), "--speed", "10")
    assert started.returncode == 0, started.stderr
    path = started.stdout.strip()
    try:
        assert run("wait-ready", "--profile", path, "--timeout", "120").returncode == 0
        # verify's prediction: a recorded one (tests/samples/vllm/cpu-pipeline, K=3), so the bench's count of the
        # stand-in's drafter lands beside it; the figures' path is tested here, their agreement on the engine tier
        recorded = json.loads((REPO / "tests" / "samples" / "vllm" / "cpu-pipeline" / "verify-summary.json").read_text())
        finished_run(work, "verify", "verify-trained", {"checkpoint": str(tiny_drafters.trained)},
                     checkpoint=str(tiny_drafters.trained), k=3, acceptance=recorded["acceptance"], checks=[])
        on = run("run", "serve-drafter", "--profile", path, "--yes", "--wait")
        assert on.returncode == 0, on.stdout + on.stderr
        assert "ready with the drafter: drafter loaded, auxiliary layers 1, 2, 3" in on.stdout, on.stdout
        snap = asyncio.run(live_drafter_snapshot(load_profile(path)))
        assert snap.server.drafter is not None and snap.server.drafter.loaded
        m, logged = snap.server.metrics, snap.server.drafter.log_stats
        # measured, not made up: the trained drafter is accepted well, in /metrics and in the log alike
        assert m.spec_mean_acceptance_length > 1.8 and m.spec_acceptance_rate > 0.25, m
        assert len(m.spec_per_position) == 3 and m.spec_window_s > 0
        assert logged is not None and logged.mean_acceptance_length > 1.8 and len(logged.per_position) == 3
        assert run("run", "serve-baseline", "--profile", path, "--yes", "--wait").returncode == 0
        # and the bench of it against the baseline, as one detached program: measured acceptance in the table
        from console.profile import write_profile
        profile = load_profile(path)
        profile.bench.dataset = str(work / "data" / "demo-prompts.jsonl")
        profile.bench.num_prompts, profile.bench.concurrency, profile.bench.max_tokens = 4, [1], 32
        write_profile(profile, Path(path), overwrite=True)
        bench = run("run", "bench", "--profile", path, "--run-id", "real", "--yes", "--wait", timeout=600)
        summary = json.loads((work / "runs" / "real" / "summary.json").read_text())
        assert bench.returncode == (3 if summary["slower"] else 0), bench.stdout[-3000:] + bench.stderr[-3000:]
        row = next(r for r in summary["comparison"]["rows"] if r["label"] == "drafter")
        assert row["acceptance_length"] > 1.8 and row["acceptance_rate"] > 0.25, row
        assert "accept len" in bench.stdout
        # the prediction beside the count, in the bench's table and in the Training pane (the console's run book)
        assert "predicted length 1.67" in bench.stdout and "vLLM counted" in bench.stdout, bench.stdout[-3000:]
        from console.snapshot import RunInfo
        from console.ui.panes.training import verify_markup

        status = json.loads(run("status", "--profile", path, "--json").stdout)
        runs = tuple(RunInfo(**r) for r in status["runs"])
        pane = verify_markup(next(r for r in runs if r.run_id == "verify-trained"), runs).plain
        assert "vLLM     counted " in pane and " drafts, bench real)" in pane, pane
        assert "predicted 1.67" in pane and "±0.60" in pane, pane
    finally:
        run("demo-host", "stop", "--dir", str(work))
