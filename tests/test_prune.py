"""Prune never deletes what a run needs (issue 28): one dependency graph read from every key of every run
record, the host's own live units, sessions and processes, resumable runs kept, the disk hint never
naming the run that asks, per-run delete results, never across a mount point, and a hostile answer
from the host left out and said (backend/kit/disk.py, console/control/disk.py)."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from backend.contract.events import EventLog
from backend.contract.runs import Manifest, open_run_dir, stage_unit_name, unit_run
from backend.kit import disk
from console.control.disk import DiskError, parse_plan, parse_survey

REPO = Path(__file__).resolve().parent.parent
DAY = 86400.0


def run(work: Path, run_id: str, stage: str, *, status: str | None = "completed", identity: dict | None = None,
        age_s: float = DAY, payload: int = 4096, files: dict[str, object] | None = None) -> Path:
    """A run directory as a stage leaves it: manifest, events (finished with `status`, or not), records."""
    rd = open_run_dir(str(work), run_id, Manifest(stage=stage, run_id=run_id, identity=identity or {}))
    log = EventLog(rd.events_path, stage, run_id)
    log.emit("start", total=1)
    if status:
        log.emit("finish", status=status, summary={"status": status})
    Path(rd.path, "data.bin").write_bytes(b"x" * payload)
    for name, data in (files or {}).items():
        Path(rd.path, name).write_text(json.dumps(data))
    when = time.time() - age_s
    for p in (Path(rd.path, "events.jsonl"), Path(rd.path)):
        os.utime(p, (when, when))
    return Path(rd.path)


def plan_of(work: Path, **kw) -> tuple[set[str], dict[str, str], disk.Plan]:
    _, runs = disk.survey(str(work))
    plan = disk.plan_prune(runs, now=time.time(), **kw)
    return {r.name for r in plan.delete}, {r.name: why for r, why in plan.keep}, plan


# ---- the dependency graph -------------------------------------------------------------------------

def test_a_warm_started_train_run_keeps_the_run_it_starts_from(tmp_path):
    """from_pretrained is a checkpoint path in the train run's identity, not an input_run."""
    work = tmp_path / "w"
    run(work, "prep", "prepare", age_s=5 * DAY)
    src = run(work, "train-src", "train", age_s=4 * DAY)
    run(work, "train-newer", "train", age_s=3 * DAY)
    run(work, "warm", "train", status=None, age_s=2 * DAY,
        identity={"input_run": "prep", "from_pretrained": str(src / "checkpoints" / "epoch-1")})
    going, kept, _ = plan_of(work, running=["warm"])
    assert "train-src" not in going
    assert kept["train-src"] == "the input of warm (manifest.json: identity.from_pretrained)"
    # stopped later: still resumable, so still kept, and so is what it starts from
    going, kept, _ = plan_of(work)
    assert kept["warm"].startswith("unfinished: resumable") and "train-src" in kept


def test_a_running_bench_pair_keeps_its_legs_and_the_checkpoint_its_drafter_start_loads(tmp_path):
    work = tmp_path / "w"
    ck = run(work, "train-a", "train", age_s=5 * DAY)
    run(work, "train-b", "train", age_s=1 * DAY)  # newer: train-a is not the newest
    run(work, "pair-baseline", "bench", age_s=2 * DAY)
    run(work, "bench-newer", "bench", age_s=DAY)
    spec = json.dumps({"method": "eagle3", "model": str(ck / "checkpoint"), "num_speculative_tokens": 3})
    plan_file = {"baseline": {"server": "baseline", "run_id": "pair-baseline", "argv": []},
                 "contenders": [{"server": "drafter", "run_id": "pair-drafter", "argv": [], "title": "drafter",
                                 "k": 3, "ours": True}],
                 "switch": {"servers": {"drafter": {"argv": ["vllm", "serve", "--speculative-config", spec]}}}}
    run(work, "pair", "bench_pair", status=None, age_s=3 * DAY,
        identity={"baseline": "pair-baseline", "drafter": "pair-drafter", "checkpoint": None},
        files={"benchpair-plan.json": plan_file})
    going, kept, _ = plan_of(work, running=["pair"], resumable=True)
    assert kept["pair-baseline"] == "the input of pair (manifest.json: identity.baseline)"
    assert kept["train-a"].startswith("the input of pair (benchpair-plan.json: switch.servers.drafter.argv[3])")
    assert going == set()


def test_the_newest_verify_keeps_the_train_run_it_vouches_for(tmp_path):
    """serve-drafter serves the checkpoint the newest verify vouches for, even once a newer train exists."""
    work = tmp_path / "w"
    t1 = run(work, "train-1", "train", age_s=5 * DAY)
    run(work, "verify-1", "verify", age_s=4 * DAY,
        identity={"input_run": "train-1", "checkpoint": str(t1 / "checkpoint")})
    run(work, "train-2", "train", age_s=DAY)
    going, kept, _ = plan_of(work)
    assert kept["train-1"] == "the input of verify-1 (manifest.json: identity.input_run)"
    assert going == set()


def test_each_deletion_says_what_it_breaks(tmp_path):
    work = tmp_path / "w"
    run(work, "gen-1", "generate", age_s=5 * DAY)
    run(work, "prep-1", "prepare", age_s=4 * DAY, identity={"input_run": "gen-1"})
    run(work, "gen-2", "generate", age_s=DAY)
    run(work, "prep-2", "prepare", age_s=DAY, identity={"input_run": "gen-2"})
    going, _, plan = plan_of(work, stage="generate")  # prep-1 stays (not selected): gen-1 breaks it
    assert going == {"gen-1"}
    assert plan.breaks["gen-1"] == "breaks prep-1 (manifest.json: identity.input_run)"
    _, _, plan = plan_of(work)
    assert plan.breaks == {"gen-1": "", "prep-1": ""}  # both go: nothing left that needs them


def test_resumable_runs_are_kept_unless_asked(tmp_path):
    work = tmp_path / "w"
    run(work, "gen", "generate", age_s=9 * DAY)
    run(work, "gen-new", "generate", age_s=DAY)
    run(work, "t-failed", "train", status="failed", age_s=5 * DAY, identity={"input_run": "gen"})
    run(work, "t-stopped", "train", status="stopped", age_s=5 * DAY)
    run(work, "t-done", "train", age_s=DAY)
    going, kept, _ = plan_of(work)
    assert going == set() and kept["t-failed"] == "failed: resumable (runs prune --resumable deletes it)"
    assert kept["t-stopped"].startswith("stopped: resumable") and kept["gen"].startswith("the input of t-failed")
    going, _, _ = plan_of(work, resumable=True)
    assert going == {"t-failed", "t-stopped", "gen"}


# ---- what the host itself sees live ---------------------------------------------------------------

def test_unit_names_are_one_fact_for_host_and_console():
    from console import naming
    assert naming.stage_unit_name is stage_unit_name
    assert unit_run(stage_unit_name("bench_pair", "a-b-c")) == ("bench_pair", "a-b-c")
    assert unit_run("e3-train-x.service") == ("train", "x")
    assert unit_run("vllm-drafter") is None and unit_run("e3-train-") is None and unit_run("e3-x.y-z") is None


def test_a_run_a_live_process_names_is_kept(tmp_path):
    """The drafter server (another console's, or one started by hand): its command line names the
    checkpoint it serves, a path under runs/."""
    work = tmp_path / "w"
    served = run(work, "train-old", "train", age_s=9 * DAY)
    run(work, "train-new", "train", age_s=DAY)
    spec = json.dumps({"method": "eagle3", "model": str(served / "checkpoint")})
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--speculative-config", spec])
    try:
        # until the child has exec'd, /proc/PID/cmdline is still pytest's
        deadline = time.monotonic() + 10
        while spec.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the child never exec'd"
            time.sleep(0.01)
        going, kept, _ = plan_of(work, live=disk.live_processes(str(work)))
        assert going == set() and kept["train-old"].startswith(f"used by live process {proc.pid} (python")
    finally:
        proc.kill()
        proc.wait()
    going, _, _ = plan_of(work, live=disk.live_processes(str(work)))
    assert going == {"train-old"}


def test_a_live_tmux_session_of_another_console_keeps_its_run(tmp_path):
    if shutil.which("tmux") is None:
        assert os.environ.get("CI") != "true", "tmux is missing under CI (scripts/install-system-deps.sh installs it)"
        pytest.skip("tmux is not installed")
    work = tmp_path / "w"
    run(work, "gen", "generate", age_s=9 * DAY)
    run(work, "old-train", "train", status="completed", age_s=8 * DAY, identity={"input_run": "gen"})
    run(work, "new-train", "train", age_s=DAY)
    run(work, "gen-2", "generate", age_s=DAY)
    env = {**os.environ, "TMUX_TMPDIR": str(tmp_path / "tmux")}
    env.pop("TMUX", None)
    (tmp_path / "tmux").mkdir()
    session = stage_unit_name("train", "old-train")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "sleep 60"], env=env, check=True)
    try:
        out = subprocess.run([sys.executable, "-m", "backend.kit.disk", "prune", "--work-dir", str(work)], env=env,
                             cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
        plan = json.loads(out.stdout)
        kept = {k["name"]: k["reason"] for k in plan["keep"]}
        assert kept["old-train"] == f"tmux session {session}" and kept["gen"].startswith("the input of old-train")
        assert plan["delete"] == []
    finally:
        subprocess.run(["tmux", "kill-server"], env=env, capture_output=True)


# ---- the disk hint ----------------------------------------------------------------------------------

def test_the_disk_hint_never_names_the_run_resuming_nor_its_inputs(tmp_path):
    from backend.kit import preflight
    work = tmp_path / "w"
    run(work, "big-gen", "generate", age_s=9 * DAY, payload=1 << 20)
    run(work, "gen-new", "generate", age_s=DAY)
    run(work, "big-failed", "train", status="failed", age_s=8 * DAY, payload=1 << 20,
        identity={"input_run": "big-gen"})
    run(work, "spare", "generate", age_s=7 * DAY, payload=1 << 20)
    # the failed train run resumes: neither it nor its input may be offered, though both are big and old
    hint = preflight.room_hint_for(str(work), 512 * 1024, run_id="big-failed")
    assert "removing spare (" in hint and "big-failed" not in hint and "big-gen" not in hint
    # a new run names its inputs: they are not offered either
    assert disk.room_hint(str(work), 512 * 1024, run_id="new", uses=[str(work / "runs" / "spare" / "x")]) == ""
    report = preflight.PreflightReport()
    saved = preflight.free_bytes
    preflight.free_bytes = lambda _p: 0  # type: ignore[assignment]  # a full disk, without filling one
    try:
        preflight.check_disk(report, str(work / "runs" / "spare"), 512 * 1024, what="x", fix="y",
                             work_dir=str(work))
    finally:
        preflight.free_bytes = saved  # type: ignore[assignment]
    assert "spare" not in report.checks[0].fix.split("free ")[1].split("removing")[-1]


# ---- deleting ---------------------------------------------------------------------------------------

def _unprivileged_work() -> Path:
    base = Path(tempfile.mkdtemp(prefix="e3-prune-"))
    base.chmod(0o755)
    return base


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a root-owned run and run as nobody")
def test_a_run_the_user_cannot_delete_is_said_and_the_rest_still_go():
    """sudo profiles: the stages run as root, the SSH user cannot delete their files; each run's result
    is said, one failure does not stop the rest, and nothing is half-deleted."""
    base = _unprivileged_work()
    try:
        work = base / "w"
        for name, age in (("a", 5), ("b", 4), ("c", 3), ("newest", 1)):
            run(work, name, "generate", age_s=age * DAY)
        (work / "runs" / "b" / "rows").mkdir()
        (work / "runs" / "b" / "rows" / "part-0").write_bytes(b"y" * 100)
        os.utime(work / "runs" / "b", (time.time() - 4 * DAY,) * 2)
        subprocess.run(["chown", "-R", "65534:65534", str(work)], check=True)
        subprocess.run(["chown", "-R", "0:0", str(work / "runs" / "b" / "rows")], check=True)  # a root stage's
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                              "-m", "backend.kit.disk", "prune", "--work-dir", str(work), "--delete", "--only", "a",
                              "--only", "b", "--only", "c"], cwd=REPO, capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert out.returncode == 0, out.stderr
        results = {d["name"]: d for d in json.loads(out.stdout)["results"]}
        assert results["a"]["deleted"] and results["c"]["deleted"]
        assert not results["b"]["deleted"] and "is owned by uid 0, not writable by uid 65534" in results["b"]["reason"]
        assert (work / "runs" / "b" / "manifest.json").exists()  # not half-deleted
        assert sorted(p.name for p in (work / "runs").iterdir()) == ["b", "newest"]
    finally:
        shutil.rmtree(base)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount")
@pytest.mark.parametrize("kind", ["bind", "tmpfs"])
def test_a_mount_inside_a_run_is_never_deleted_through_nor_counted(tmp_path, kind):
    from harness.rig.tmpfs import small_tmpfs
    work = tmp_path / "w"
    rd = run(work, "old", "generate", age_s=9 * DAY)
    run(work, "new", "generate", age_s=DAY)
    volume = tmp_path / "volume"
    mnt = rd / "mnt"
    if kind == "bind":  # a directory of the same filesystem: the same st_dev, only the mount table tells
        volume.mkdir()
        (volume / "precious").write_bytes(b"z" * (1 << 20))
        mnt.mkdir()
        done = subprocess.run(["mount", "--bind", str(volume), str(mnt)], capture_output=True, text=True)
        if done.returncode != 0:
            assert os.environ.get("CI") != "true", f"cannot bind-mount under CI (it runs as root): {done.stderr.strip()}"
            pytest.skip(f"cannot bind-mount: {done.stderr.strip()}")
        ctx = None
    else:
        ctx = small_tmpfs(mnt, "4m")
        ctx.__enter__()
        (mnt / "precious").write_bytes(b"z" * (1 << 20))
    os.utime(rd, (time.time() - 9 * DAY,) * 2)  # the mkdir made it the newest
    try:
        _, runs = disk.survey(str(work))
        old = next(r for r in runs if r.name == "old")
        assert old.mounts == (str(mnt.resolve()),) and old.size < 1 << 20
        going, kept, _ = plan_of(work)
        assert going == set() and kept["old"].startswith("holds a mount point (")
        # asked anyway (a plan made before the mount): refused, said, nothing under the mount touched
        result = disk.delete(str(work), disk.Plan(delete=[old]), ["old"])
        assert not result[0].deleted and "holds a mount point" in result[0].reason
        assert (mnt / "precious").stat().st_size == 1 << 20 and (rd / "manifest.json").exists()
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
        else:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    if kind == "bind":
        assert (volume / "precious").exists()


def test_a_run_renamed_mid_survey_is_left_out_and_said(tmp_path, monkeypatch):
    work = tmp_path / "w"
    run(work, "a", "generate", age_s=3 * DAY)
    run(work, "b", "generate", age_s=2 * DAY)
    real = disk._read_state

    def renamed_meanwhile(path: str):
        if path.endswith("/a"):
            os.rename(path, path + "-moved")  # another console's --fresh, a `mv` by hand
        return real(path)
    monkeypatch.setattr(disk, "_read_state", renamed_meanwhile)
    skipped: list[tuple[str, str]] = []
    _, runs = disk.survey(str(work), skipped)
    assert [r.name for r in runs] == ["b"] and skipped[0][0] == "a" and "changed while it was read" in skipped[0][1]


# ---- the console reads the host's answer as untrusted ----------------------------------------------

def test_a_hostile_answer_is_left_out_and_said_never_a_crash():
    good = {"name": "ok", "run_id": "ok", "stage": "generate", "state": "completed", "size": 10, "mtime": 1.0}
    answer = json.loads(json.dumps({
        "volumes": [{"path": "/w", "free": float("inf"), "total": 10}, "junk"],
        "runs": [good, {**good, "name": "huge", "size": float("inf")}, {**good, "name": "nan", "mtime": float("nan")},
                 {**good, "name": "neg", "size": -5}, "junk"],
        "skipped": [{"name": "x", "reason": "changed while it was read"}]}))
    report = parse_survey(answer)
    assert [r.name for r in report.runs] == ["ok"] and report.volumes == ()
    assert len(report.skipped) == 7 and report.skipped[0] == "x: changed while it was read"
    assert any("run 'huge' size" in s for s in report.skipped)
    plan = parse_plan({"delete": answer["runs"], "keep": {"not": "a list"}, "total_bytes": float("nan"),
                       "results": [{"name": "ok", "deleted": True}, 7]})
    assert [r.name for r in plan.delete] == ["ok"] and plan.total_bytes == 10 and plan.deleted == ("ok",)
    assert parse_plan({"delete": 5}).delete == ()
    with pytest.raises(DiskError):
        from console.control.disk import _json
        _json("[" * 100000)


# ---- randomized: nothing needed is ever deleted -----------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_randomized_graphs_never_lose_what_a_kept_run_needs(tmp_path, seed):
    rnd = random.Random(seed)
    work = tmp_path / "w"
    stages = ["generate", "prepare", "extract", "train", "verify", "bench", "bench_pair", "pipeline"]
    names: list[str] = []
    states = ["completed"] * 4 + ["failed", "stopped", None]
    for i in range(rnd.randint(8, 30)):
        name = f"r{i}"
        identity: dict = {}
        files: dict = {}
        earlier = rnd.sample(names, k=min(len(names), rnd.randint(0, 3)))
        for j, dep in enumerate(earlier):
            how = rnd.choice(["input_run", "from_pretrained", "leg", "stages", "plan", "summary"])
            path = str(work / "runs" / dep / "checkpoint")
            if how == "input_run":
                identity["input_run"] = dep
            elif how == "from_pretrained":
                identity["from_pretrained"] = path
            elif how == "leg":
                identity[f"server{j}"] = dep
            elif how == "stages":
                identity.setdefault("stages", []).append(["generate", dep])
            elif how == "plan":
                files.setdefault("plan.json", {"argv": []})["argv"].append(f"--model={path}")
            else:
                files.setdefault("summary.json", {})["checkpoint"] = path
        run(work, name, rnd.choice(stages), status=rnd.choice(states), identity=identity, files=files,
            age_s=rnd.uniform(0, 30) * DAY if rnd.random() > 0.1 else rnd.uniform(0, 300))
        names.append(name)
    truth = {}  # every dependency as written, read back independently of backend.kit.disk's parser
    for name in names:
        blob = "".join(p.read_text() for p in (work / "runs" / name).glob("*.json"))
        truth[name] = {d for d in names if d != name and (f'"{d}"' in blob or f"/runs/{d}/" in blob)}
    running = set(rnd.sample(names, k=rnd.randint(0, 3)))
    live = {n: "a live unit" for n in rnd.sample(names, k=rnd.randint(0, 2))}
    resumable = rnd.random() < 0.5
    _, runs = disk.survey(str(work))
    plan = disk.plan_prune(runs, running=running, live=live, now=time.time(), resumable=resumable)
    going = {r.name for r in plan.delete}
    by = {r.name: r for r in runs}
    kept = set(names) - going
    needed = set()
    todo = [n for n in kept]
    while todo:
        n = todo.pop()
        for d in truth[n]:
            if d not in needed:
                needed.add(d)
                todo.append(d)
    assert not (needed & going), f"seed {seed}: deletes what kept runs need: {needed & going}"
    assert not ((running | set(live)) & going)
    if not resumable:
        assert all(by[n].state == "completed" for n in going)
    newest = {}
    for r in runs:
        if r.state == "completed" and (r.stage not in newest or r.mtime > newest[r.stage].mtime):
            newest[r.stage] = r
    assert not ({r.name for r in newest.values()} & going)
    # and deleting exactly that list leaves every kept run's needs on disk
    results = disk.delete(str(work), plan, sorted(going))
    assert all(d.deleted for d in results)
    left = {p.name for p in (work / "runs").iterdir()}
    assert left == kept and all(truth[n] <= left for n in kept)


async def test_the_delete_runs_as_the_stages_do_through_sudo_where_the_profile_says(tmp_path, monkeypatch):
    """sudo = true: the stages run as root (systemd-run through `sudo -n`, no --uid), so the delete goes
    through `sudo -n` too, and only the delete (the plan reads as the SSH user). A `sudo` first on PATH
    that notes its argv and runs it stands in for sudo: the tests run as root, where sudo changes nothing."""
    import dataclasses

    from console import demo
    from console.control import disk as cdisk
    from console.host.factory import host_for_profile
    shim = tmp_path / "bin"
    shim.mkdir()
    log = tmp_path / "sudo.log"
    (shim / "sudo").write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$1" = -n ] && shift\nexec "$@"\n')
    (shim / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    profile = demo.prepare(tmp_path / "d")
    work = Path(profile.paths.work_dir)
    run(work, "old", "generate", age_s=9 * DAY)
    run(work, "new", "generate", age_s=DAY)
    profile = dataclasses.replace(profile, server=dataclasses.replace(profile.server, sudo=True))
    host = host_for_profile(profile)
    try:
        plan = await cdisk.prune(host, profile, [])
        assert [r.name for r in plan.delete] == ["old"] and not log.exists()
        done = await cdisk.prune(host, profile, [], only=["old"])
    finally:
        await host.close()
    assert done.results == (cdisk.Deletion("old", True),) and not (work / "runs" / "old").exists()
    assert log.read_text().startswith("-n env PYTHONPATH=") and "backend.kit.disk prune --delete --only old" in log.read_text()


async def test_p_lists_every_run_it_deletes_and_deletes_exactly_those():
    """The app's prune: one confirmation naming every run (scrollable, each with its size and what it
    breaks), and the Yes deletes exactly that list. (The fake controller: the live app against a real
    Session is another test's; this one is about what the dialog shows and what its Yes sends.)"""
    from console.control.disk import PrunePlan, RunSpace
    from console.session import ActionResult
    from console.ui.app import ConsoleApp
    from console.ui.screens.confirm import ConfirmScreen
    from harness.fake_controller import FakeController, base_snapshot

    runs = tuple(RunSpace(f"gen-{i:02d}", f"gen-{i:02d}", "generate", "completed", (i + 1) << 20, 0.0, False,
                          breaks="breaks prep-9 (manifest.json: identity.input_run)" if i == 29 else "")
                 for i in range(30))
    deleted: list[list[str]] = []

    class Fake(FakeController):
        async def prune_plan(self):
            return PrunePlan(delete=runs, keep=(), total_bytes=sum(r.size for r in runs))

        async def prune_runs(self, names):
            deleted.append(names)
            return ActionResult(True, "\n".join(f"{n}: deleted" for n in names))

    app = ConsoleApp(Fake([base_snapshot()]), clock=lambda: 1_700_000_010.0)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("p")
        for _ in range(50):
            if isinstance(app.screen, ConfirmScreen):
                break
            await pilot.pause(0.05)
        screen = app.screen
        assert isinstance(screen, ConfirmScreen) and screen.question.startswith("Delete these 30 run(s), 465.0 MiB")
        assert all(f"  generate completed  {r.name}" in screen.detail for r in runs)
        assert "30.0 MiB  generate completed  gen-29  (breaks prep-9 (manifest.json: identity.input_run))" in screen.detail
        scroll = screen.query_one("#confirm-scroll")
        await pilot.press("pagedown")
        await pilot.pause(0.1)
        assert scroll.scroll_y > 0  # the list is longer than the dialog: it scrolls, it is not cut
        await pilot.press("y")
        for _ in range(50):
            if deleted:
                break
            await pilot.pause(0.05)
    assert deleted == [[r.name for r in runs]]
