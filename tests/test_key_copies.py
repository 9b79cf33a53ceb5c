"""The vLLM API key's copies on the host never outlive the runs that read them (backend/kit/secret_files.py).

The console hands a detached run the key as a 0600 file in the work dir's secrets/, one copy per start
(`vllm-api-key-<run>.<random>`). On the demo host, black-box through `eagle3-console run` and the host
programs: after a bench pair that completes, one that fails, one stopped mid-run, a lone bench, and a
generate refused at its preflight, no `secrets/vllm-api-key*` is left; the programs refused before they
run (their run lock held by another, a bad plan, bad arguments) remove their copy too.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.contract.events import EventLog
from backend.contract.runs import Manifest, open_run_dir
from backend.kit.runlock import RunLock
from console.profile import load_profile, write_profile

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parent.parent
KEY_ENV = "E3_TEST_KEY_COPIES"
SECRET = "sk-key-copies-not-for-logs"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL, env={**os.environ, KEY_ENV: SECRET})


def program(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A host program run as the host runs it (its own process, the repo's backend on its path)."""
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})


def key_copies(work: Path) -> list[str]:
    """Every copy of the API key in the work dir's secrets/ (the old shared one included)."""
    secrets = work / "secrets"
    return sorted(p.name for p in secrets.glob("vllm-api-key*")) if secrets.is_dir() else []


def copy_of_key(work: Path, name: str) -> Path:
    """A copy of the key as the console leaves it (0600 in the 0700 secrets/)."""
    secrets = work / "secrets"
    secrets.mkdir(mode=0o700, exist_ok=True)
    path = secrets / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(SECRET + "\n")
    return path


def finished_run(work: Path, stage: str, run_id: str, outputs: dict) -> None:
    run = open_run_dir(str(work), run_id, Manifest(stage=stage, run_id=run_id, identity={"n": run_id}))
    events = EventLog(run.events_path, stage, run_id)
    events.emit("start", total=1, manifest=run.manifest.to_dict())
    summary = {"stage": stage, "run_id": run_id, "ok": True, "outputs": outputs}
    run.write_summary(summary)
    events.emit("finish", status="completed", summary=summary)
    events.close()


def summary(work: Path, run_id: str) -> dict:
    return json.loads((work / "runs" / run_id / "summary.json").read_text())


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo host with an API key in the profile (the stand-in does not ask for one: what is checked
    here is where the console's copies go), a short bench, and a verified SIMULATED drafter."""
    work = tmp_path_factory.mktemp("keys") / "demo"
    started = cli("demo-host", "start", "--dir", str(work), "--speed", "10")
    assert started.returncode == 0, started.stderr
    path = started.stdout.strip()
    try:
        profile = load_profile(path)
        profile.server.api_key_env = KEY_ENV
        profile.bench.dataset = str(work / "data" / "demo-prompts.jsonl")
        profile.bench.num_prompts, profile.bench.concurrency, profile.bench.max_tokens = 4, [1], 24
        write_profile(profile, Path(path), overwrite=True)
        ckpt = work / "runs-ck" / "checkpoint_best"
        ckpt.mkdir(parents=True)
        finished_run(work, "verify", "verify-1", {"checkpoint": str(ckpt)})
        assert cli("wait-ready", "--profile", path, "--timeout", "120").returncode == 0
        yield work, path
    finally:
        cli("demo-host", "stop", "--dir", str(work))


def legs_key_files(work: Path, run_id: str) -> set[str]:
    """The --api-key-file of every bench the pair ran (its plan, kept in its run dir)."""
    plan = json.loads((work / "runs" / run_id / "benchpair-plan.json").read_text())
    legs = [plan["baseline"], *plan["contenders"]]
    return {leg["argv"][leg["argv"].index("--api-key-file") + 1] for leg in legs}


def test_a_bench_pair_reads_one_copy_and_removes_it_when_it_completes(demo):
    work, path = demo
    done = cli("run", "bench", "--profile", path, "--run-id", "pair-ok", "--yes", "--wait", timeout=600)
    assert summary(work, "pair-ok")["status"] == "completed", done.stdout[-3000:] + done.stderr[-3000:]
    # every bench of the pair read the same per-run copy (a bench refuses a file it cannot read) ...
    files = legs_key_files(work, "pair-ok")
    assert len(files) == 1 and Path(files.pop()).name.startswith("vllm-api-key-pair-ok.")
    # ... which the pair removed at its end; the key itself is in no command line or log the console shows
    assert key_copies(work) == []
    assert stat.S_IMODE((work / "secrets").stat().st_mode) == 0o700
    assert SECRET not in done.stdout + done.stderr
    assert SECRET not in (work / "runs" / "pair-ok" / "events.jsonl").read_text()


def test_a_bench_pair_that_fails_removes_its_copy(demo):
    work, path = demo
    profile = load_profile(path)
    profile.bench.dataset = str(work / "data" / "no-such-prompts.jsonl")  # every bench of it refuses
    failing = work / "failing-profile.toml"
    write_profile(profile, failing, overwrite=True)
    done = cli("run", "bench", "--profile", str(failing), "--run-id", "pair-bad", "--yes", "--wait", timeout=600)
    assert done.returncode != 0 and summary(work, "pair-bad")["status"] == "failed", done.stderr[-3000:]
    assert key_copies(work) == []


def test_a_bench_pair_stopped_mid_run_removes_its_copy(demo):
    work, path = demo
    started = cli("run", "bench", "--profile", path, "--run-id", "pair-stop", "--yes")
    assert started.returncode == 0, started.stderr
    events = work / "runs" / "pair-stop" / "events.jsonl"
    deadline = time.monotonic() + 120
    while not (events.exists() and '"start"' in events.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    # running: its copy is there for the benches still to come
    assert [n for n in key_copies(work) if n.startswith("vllm-api-key-pair-stop.")], key_copies(work)
    stopped = cli("run", "stop", "--profile", path, "--run-id", "pair-stop", "--wait", timeout=300)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert summary(work, "pair-stop")["status"] == "stopped"
    assert key_copies(work) == []


def test_a_lone_bench_removes_its_own_copy_and_a_leg_of_a_pair_leaves_it(demo):
    work, path = demo
    port = str(load_profile(path).server.port)
    bench = ["backend.bench", "--work-dir", str(work), "--endpoint", f"http://127.0.0.1:{port}",
             "--model", load_profile(path).server.model_id, "--prompts", str(work / "data" / "demo-prompts.jsonl"),
             "--num-prompts", "2", "--concurrency", "1", "--max-tokens", "8", "--client", "ours"]
    lone = copy_of_key(work, "vllm-api-key-lone.0a1b2c3d")
    done = program(*bench, "--run-id", "lone", "--api-key-file", str(lone), "--remove-api-key-file")
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary(work, "lone")["status"] == "completed" and not lone.exists()
    # refused before it runs (no such prompts): its copy goes all the same
    refused = copy_of_key(work, "vllm-api-key-lone2.0a1b2c3d")
    bad = [a if a != str(work / "data" / "demo-prompts.jsonl") else str(work / "nope.jsonl") for a in bench]
    done = program(*bad, "--run-id", "lone2", "--api-key-file", str(refused), "--remove-api-key-file")
    assert done.returncode == 2 and not refused.exists(), done.stderr
    # a bench of a pair (no --remove-api-key-file) leaves the copy for the next one; the pair removes it
    shared = copy_of_key(work, "vllm-api-key-leg.0a1b2c3d")
    done = program(*bench, "--run-id", "leg", "--api-key-file", str(shared))
    assert done.returncode == 0 and shared.exists(), done.stderr[-3000:]
    shared.unlink()
    assert key_copies(work) == []


def test_a_generate_refused_at_its_preflight_leaves_no_copy(demo):
    """The preflight reads the run's copy and leaves it for the run; refused, the run never starts, and the
    console removes the copy it uploaded."""
    work, path = demo
    done = cli("run", "generate", "--profile", path, "--run-id", "gen-refused", "--dataset",
               str(work / "data" / "no-such-dataset.jsonl"), "--yes")
    assert done.returncode != 0 and "preflight failed" in done.stderr, done.stdout + done.stderr
    assert not (work / "runs" / "gen-refused" / "summary.json").exists()
    assert key_copies(work) == []
    assert SECRET not in done.stdout + done.stderr


def test_a_pipeline_that_never_starts_its_generate_removes_the_copy(demo):
    """The pipeline's generate gets its own copy (read and removed by generate when it starts); a pipeline
    that skips it (completed before) never starts the reader, so the chain removes the copy at its end."""
    work, path = demo
    finished_run(work, "generate", "chain-skip-generate", {"records": str(work / "data" / "demo-prompts.jsonl")})
    done = cli("run", "pipeline", "--profile", path, "--from", "generate", "--to", "generate", "--run-id",
               "chain-skip", "--yes", "--wait", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert summary(work, "chain-skip")["stages"][0].get("skipped") is True
    assert key_copies(work) == []


# ---- programs refused before they run: their copy goes too -------------------------------------------------
def test_programs_refused_by_the_run_lock_remove_their_copy(tmp_path):
    """Another start of the same run holds its lock: this start's own copy goes (the holder's is another
    file, so the holder's benches still read theirs)."""
    holder = copy_of_key(tmp_path, "vllm-api-key-r1.11111111")
    lock = RunLock(str(tmp_path), "r1", "the other start")
    lock.acquire()
    try:
        mine = copy_of_key(tmp_path, "vllm-api-key-r1.22222222")
        done = program("backend.generate", "--dataset", str(tmp_path / "d.jsonl"), "--work-dir", str(tmp_path),
                       "--run-id", "r1", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--skip-preflight",
                       "--api-key-file", str(mine), "--remove-api-key-file")
        assert done.returncode == 2 and not mine.exists(), done.stderr
        mine = copy_of_key(tmp_path, "vllm-api-key-r1.33333333")
        done = program("backend.bench", "--work-dir", str(tmp_path), "--run-id", "r1", "--endpoint",
                       "http://127.0.0.1:9", "--model", "m", "--prompts", str(write_prompts(tmp_path)),
                       "--max-tokens", "4", "--client", "ours", "--api-key-file", str(mine), "--remove-api-key-file")
        assert done.returncode == 2 and "the other start" in done.stderr and not mine.exists(), done.stderr
        mine = copy_of_key(tmp_path, "vllm-api-key-r1.44444444")
        done = program("backend.benchpair", "--work-dir", str(tmp_path), "--run-id", "r1", "--plan",
                       str(pair_plan(tmp_path, mine)), "--secret-file", str(mine))
        assert done.returncode == 2 and "the other start" in done.stderr and not mine.exists(), done.stderr
    finally:
        lock.release()
    assert holder.exists() and key_copies(tmp_path) == [holder.name]


def test_programs_refusing_their_arguments_or_plan_remove_their_copy(tmp_path):
    copy = copy_of_key(tmp_path, "vllm-api-key-g.0a1b2c3d")
    done = program("backend.generate", "--dataset", "d.jsonl", "--work-dir", str(tmp_path), "--run-id", "g",
                   "--endpoint", "http://127.0.0.1:9", "--model", "m", "--concurrency", "0",
                   "--api-key-file", str(copy), "--remove-api-key-file")
    assert done.returncode == 2 and not copy.exists(), done.stderr
    copy = copy_of_key(tmp_path, "vllm-api-key-b.0a1b2c3d")
    done = program("backend.bench", "--work-dir", str(tmp_path), "--run-id", "b", "--endpoint", "not-a-url",
                   "--model", "m", "--prompts", "p.jsonl", "--api-key-file", str(copy), "--remove-api-key-file")
    assert done.returncode == 2 and not copy.exists(), done.stderr
    for prog, name in (("backend.benchpair", "p"), ("backend.chain", "c")):
        copy = copy_of_key(tmp_path, f"vllm-api-key-{name}.0a1b2c3d")
        bad_plan = tmp_path / f"{name}-plan.json"
        bad_plan.write_text("{}")
        done = program(prog, "--work-dir", str(tmp_path), "--run-id", name, "--plan", str(bad_plan),
                       "--secret-file", str(copy))
        assert done.returncode == 2 and not copy.exists(), (prog, done.stderr)
    assert key_copies(tmp_path) == []


def test_a_secret_file_outside_the_work_dirs_secrets_is_refused_and_left_alone(tmp_path):
    other = tmp_path / "not-a-secret.txt"
    other.write_text("keep me")
    for prog in ("backend.benchpair", "backend.chain"):
        done = program(prog, "--work-dir", str(tmp_path), "--run-id", "x", "--plan", str(tmp_path / "plan.json"),
                       "--secret-file", str(other))
        assert done.returncode == 2 and "expected a file in" in done.stderr and other.exists(), done.stderr


def write_prompts(where: Path) -> Path:
    path = where / "prompts.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                            for i in range(4)))
    return path


def pair_plan(where: Path, key: Path) -> Path:
    """A plan the pair accepts (as console/control/bench_pair.py writes one; refused by the run lock before
    it runs, nothing of it starts)."""
    bench = [sys.executable, "-m", "backend.bench", "--api-key-file", str(key)]

    def server(name: str) -> dict:
        return {"name": name, "unit": name, "start": ["true"], "stop": ["true"], "alive": ["false"]}

    plan = {"checkpoint": "/ck", "baseline": {"server": "baseline", "run_id": "r1-baseline", "argv": bench},
            "contenders": [{"server": "drafter", "run_id": "r1-drafter", "argv": bench, "title": "drafter",
                            "k": 3, "ours": True}],
            "switch": {"version": 1, "home": server("baseline"), "away": [server("drafter")],
                       "endpoint": "http://127.0.0.1:9", "ready_timeout_s": 30, "command_timeout_s": 30,
                       "stop_check_s": 10, "lock_path": ""}}
    path = where / "pair-plan.json"
    path.write_text(json.dumps(plan))
    return path
