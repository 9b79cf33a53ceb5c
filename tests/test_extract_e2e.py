"""The extract stage end to end on this machine, as on a tmux host: the baseline stand-in runs in its own
tmux session (a private tmux server), the console's swap plan (console/control/extraction.py) is handed to
`python -m backend.extract`, which stops the baseline, starts the extraction stand-in (the tiny verifier,
real hidden states) in its own session, drives speculators' generate-offline-data, and brings the baseline
back: after success, after an extraction server that dies midway, and after SIGTERM."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harness.drafter_support import PREPARED_ROWS as ROWS
from harness.drafter_support import REPO, copy_runs, prepared_work, stage_env, tiny_verifier
from harness.rig.availability import rig_unavailable
from harness.sim_support import free_port
from harness.tmux_host import AUX, LAYERS, Host

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_verifier(tmp_path_factory)


@pytest.fixture(scope="module")
def work(tiny, tmp_path_factory) -> Path:
    """A work dir holding a completed generation run and its prepare run (20 train, 4 held-out rows)."""
    return prepared_work(tmp_path_factory, tiny)


@pytest.fixture(scope="module")
def tmux_env(tmp_path_factory):
    """A private tmux server for the module (as the demo host keeps its own), ended afterwards."""
    if shutil.which("tmux") is None:
        rig_unavailable("tmux is not installed")
    tmp = tmp_path_factory.mktemp("tmux")
    os.chmod(tmp, 0o700)
    env = {**stage_env(tmp_path_factory), "TMUX_TMPDIR": str(tmp)}
    yield env
    subprocess.run(["tmux", "kill-server"], env=env, capture_output=True)


def extract_cmd(work: Path, tiny: Path, run_id: str, plan: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "backend.extract", "--work-dir", str(work), "--run-id", run_id, "--input-run",
            "prep", "--verifier", str(tiny), "--aux-layer-ids", ",".join(map(str, AUX)), "--plan", str(plan),
            "--health-interval", "0.5", "--progress-interval", "0.5", *extra]


def events(work: Path, run_id: str) -> list[dict]:
    return [json.loads(l) for l in (work / "runs" / run_id / "events.jsonl").read_text().splitlines()]


def steps(summary: dict) -> list[tuple[str, bool]]:
    return [(s["step"], s["ok"]) for s in summary["swap"]["steps"]]


SWAP_OK = [("stop_baseline", True), ("start_extractor", True), ("stop_extractor", True), ("start_baseline", True)]


def test_extract_swaps_servers_writes_every_rows_hidden_states_and_brings_the_baseline_back(
        tiny, work, tmux_env, tmp_path):
    from datasets import load_from_disk
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states

    host = Host(work, tmux_env, "ok", [])
    host.start_baseline()
    try:
        res = subprocess.run(extract_cmd(work, tiny, "ex-ok", host.write_plan("ex-ok", tmp_path / "plan.json"),
                                         "--concurrency", "4"),
                             env=tmux_env, cwd=REPO, capture_output=True, text=True, timeout=200)
        assert res.returncode == 0, res.stderr
        run = work / "runs" / "ex-ok"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["done"] == summary["total"] == ROWS
        assert steps(summary) == SWAP_OK and summary["swap"]["baseline_restarted"] is True
        assert summary["aux_layer_ids"] == AUX and summary["hidden_size"] == 64
        prep = json.loads((work / "runs/prep/summary.json").read_text())["outputs"]
        assert summary["outputs"] == {"train_hidden_states": str(run / "train_hidden_states"),
                                      "heldout_hidden_states": str(run / "heldout_hidden_states"),
                                      "train_data": prep["train_data"], "heldout_data": prep["heldout_data"],
                                      "token_freq": prep["token_freq"]}
        for side in ("train", "heldout"):
            rows = load_from_disk(prep[f"{side}_data"]).with_format(None)
            files = sorted(p.name for p in (run / f"{side}_hidden_states").iterdir())
            assert files == sorted(f"hs_{i}.safetensors" for i in range(len(rows)))
            for i in (0, len(rows) - 1):  # aligned with the dataset rows, in speculators' layout
                data = load_file(run / f"{side}_hidden_states" / f"hs_{i}.safetensors")
                check_hidden_states(data, rows[i]["input_ids"])
                assert tuple(data["hidden_states"].shape) == (len(rows[i]["input_ids"]), len(AUX) + 1, 64)
        assert not Path(summary["swap"]["steps"][0]["command"]).exists()  # (a command, not a path)
        assert not (work / "extract-staging" / "ex-ok").exists()  # the connector's staging dir is cleaned
        # the console sees the swap as it happened, phase by phase
        phases = [e["phase"] for e in events(work, "ex-ok") if e["kind"] == "progress"]
        order = ["stopping_baseline", "starting_extractor", "extracting", "stopping_extractor", "starting_baseline"]
        assert [p for i, p in enumerate(phases) if p in order and (i == 0 or phases[i - 1] != p)] == order
        assert "swap: stop_baseline ok, start_extractor ok, stop_extractor ok, start_baseline ok; baseline " \
               "started again" in res.stdout
        # the baseline is back: its own command in its own session, answering again; the extractor is gone
        assert host.baseline_is_back() and f"{host.unit}-extract" not in host.panes()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{host.port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail("the baseline did not answer again")
    finally:
        host.stop_all()


def test_an_extraction_server_that_dies_midway_fails_the_stage_with_why_and_the_baseline_comes_back(
        tiny, work, tmux_env, tmp_path):
    host = Host(work, tmux_env, "die", ["--fault", "die-after:5"])
    host.start_baseline()
    try:
        res = subprocess.run(extract_cmd(work, tiny, "ex-die", host.write_plan("ex-die", tmp_path / "plan.json"),
                                         "--concurrency", "2"),
                             env=tmux_env, cwd=REPO, capture_output=True, text=True, timeout=200)
        assert res.returncode == 1, res.stderr
        summary = json.loads((work / "runs/ex-die/summary.json").read_text())
        assert summary["status"] == "failed"
        assert summary["error"].startswith("the extraction server died midway (")
        assert "EngineCore" in summary["error"]  # its last log lines say why
        assert summary["error"].endswith("Start the run again to resume")
        assert steps(summary) == SWAP_OK and summary["swap"]["baseline_restarted"] is True
        assert host.baseline_is_back() and f"{host.unit}-extract" not in host.panes()
        finish = events(work, "ex-die")[-1]
        assert finish["kind"] == "finish" and finish["status"] == "failed"
        done = summary["done"]
        assert 0 < done < ROWS
        # the same run again (a healthy server this time) resumes: only the missing rows are asked for
        healthy = Host(work, tmux_env, "die", [], port=host.port)
        res = subprocess.run(extract_cmd(work, tiny, "ex-die", healthy.write_plan("ex-die", tmp_path / "plan2.json"),
                                         "--concurrency", "4"),
                             env=tmux_env, cwd=REPO, capture_output=True, text=True, timeout=200)
        assert res.returncode == 0, res.stderr
        start = [e for e in events(work, "ex-die") if e["kind"] == "start"][-1]
        assert start["resumed"] is True and start["already_done"] == done
        assert json.loads((work / "runs/ex-die/summary.json").read_text())["done"] == ROWS
    finally:
        host.stop_all()


def test_sigterm_stops_the_extraction_and_brings_the_baseline_back(tiny, work, tmux_env, tmp_path):
    host = Host(work, tmux_env, "term", ["--latency", "0.4"])
    host.start_baseline()
    try:
        proc = subprocess.Popen(extract_cmd(work, tiny, "ex-term", host.write_plan("ex-term", tmp_path / "plan.json"),
                                            "--concurrency", "1"),
                                env=tmux_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out_dir = work / "runs" / "ex-term" / "train_hidden_states"
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not (out_dir.is_dir() and any(out_dir.iterdir())):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        summary = json.loads((work / "runs/ex-term/summary.json").read_text())
        assert summary["status"] == "stopped" and 0 < summary["done"] < ROWS
        assert "received SIGTERM" in summary["error"]
        assert steps(summary) == SWAP_OK and summary["swap"]["baseline_restarted"] is True
        assert host.baseline_is_back() and f"{host.unit}-extract" not in host.panes()
        kinds = [e["kind"] for e in events(work, "ex-term")]
        assert kinds[0] == "start" and kinds[-1] == "finish" and "error" in kinds
    finally:
        host.stop_all()


def marker_plan(tmp_path: Path, aux=AUX, asked=None, endpoint: str | None = None) -> tuple[Path, Path]:
    """A plan whose commands only leave a trace, to prove a refused run never touched the servers."""
    marker = tmp_path / "ran.txt"
    step = lambda name: ["sh", "-c", f"echo {name} >> {marker}"]  # noqa: E731
    server = lambda name: {"name": name, "unit": name, "start": step(f"start_{name}"),  # noqa: E731
                           "stop": step(f"stop_{name}")}
    plan = {"version": 2, "switch": {"version": 1, "home": server("baseline"), "away": [server("extractor")],
                                     "endpoint": endpoint or f"http://127.0.0.1:{free_port()}", "ready_timeout_s": 5,
                                     "lock_path": str(tmp_path / "state" / "servers.lock")},
            "storage_path": str(tmp_path / "hs"), "aux_layer_ids": aux, "extract_layer_ids": asked or [*aux, LAYERS]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return tmp_path / "plan.json", marker


def test_an_extraction_that_cannot_fit_is_refused_before_anything_is_touched(tiny, work, tmp_path, tmux_env):
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if mounted.returncode != 0:
        rig_unavailable(f"cannot mount a small tmpfs for the disk test (needs root): {mounted.stderr.strip()}")
    try:
        copy_runs(work, mnt)
        plan, marker = marker_plan(tmp_path)
        cmd = extract_cmd(mnt, tiny, "ex-big", plan, "--reserve-bytes", "0")
        res = subprocess.run(cmd, env=tmux_env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, res.stderr
        assert "extract: disk_space: hidden states of 24 rows (" in res.stderr
        need = re.search(r" tokens x \(3 aux layers \+ 1\) x hidden 64 x 4 bytes\) need ([\d.]+) MB", res.stderr)
        assert need and float(need.group(1)) > 1.0, res.stderr  # more than the 1 MB tmpfs holds
        # without --online-ok (the console passes it only where the GPU plan allows online training, never on
        # a host whose baseline holds every GPU) the ways out are the host's own: fewer rows, shorter rows, room
        assert "-> it does not fit" in res.stderr and "fewer samples: about " in res.stderr, res.stderr
        assert "another volume: move the work dir to one with at least " in res.stderr
        assert "online" not in res.stderr
        online = subprocess.run(cmd + ["--online-ok"], env=tmux_env, cwd=REPO, capture_output=True, text=True,
                                timeout=120)
        assert online.returncode == 2 and "; or train online: set [extract] online = true" in online.stderr
        assert not marker.exists() and not (mnt / "runs" / "ex-big").exists()
        pre = subprocess.run(cmd + ["--preflight-only"], env=tmux_env, cwd=REPO, capture_output=True, text=True,
                             timeout=120)
        report = json.loads(pre.stdout)
        assert pre.returncode == 1 and report["ok"] is False and report["estimate"]["fits"] is False
        assert report["estimate"]["rows"] == ROWS and report["estimate"]["aux_layers"] == 3
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_baseline_older_than_extraction_is_refused_before_the_swap(tiny, work, tmp_path, tmux_env):
    """The stage asks the baseline's /version before its swap stops it (the console asked too, when it
    started the stage; a pipeline's extract may start later): vLLM 0.16 has no extract_hidden_states."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "sim.vllm_server", "--host", "127.0.0.1", "--port", str(port),
                               "--model", "/shared/tiny", "--load-seconds", "0.2", "--vllm-version", "0.16.0"],
                              env=tmux_env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/version", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        plan, marker = marker_plan(tmp_path, endpoint=f"http://127.0.0.1:{port}")
        dst = tmp_path / "w"
        copy_runs(work, dst)
        res = subprocess.run(extract_cmd(dst, tiny, "ex-old", plan), env=tmux_env, cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().startswith(
            "extract: vllm_version: the baseline reports vLLM 0.16.0, extraction needs vLLM >= 0.17.0: the "
            "extract_hidden_states method and its KV connector arrived in vLLM 0.17.0 -> upgrade vLLM"), res.stderr
        assert not marker.exists() and not (dst / "runs" / "ex-old").exists()
    finally:
        server.terminate()
        server.wait(30)


@pytest.mark.parametrize("case", ["prepare-running", "no-verifier", "layers-out-of-range", "plan-other-layers",
                                  "plan-without-final"])
def test_bad_input_is_one_clear_line_and_the_servers_are_never_touched(case, tiny, work, tmp_path, tmux_env):
    from backend.contract.events import EventLog
    from backend.contract.runs import Manifest, open_run_dir

    dst = tmp_path / "w"
    copy_runs(work, dst)
    input_run, verifier, aux = "prep", str(tiny), AUX
    if case == "prepare-running":
        run = open_run_dir(str(dst), "prep2", Manifest(stage="prepare", run_id="prep2", identity={}))
        EventLog(run.events_path, "prepare", "prep2").emit("start", total=3)
        input_run = "prep2"
    elif case == "no-verifier":
        verifier = str(tmp_path / "gone")
    elif case == "layers-out-of-range":
        aux = [1, 2, 4]
    plan, marker = marker_plan(tmp_path, aux=[1, 2] if case == "plan-other-layers" else aux,
                               asked=[*AUX, 5] if case == "plan-without-final" else None)
    before = sorted(p.relative_to(dst) for p in dst.rglob("*"))
    res = subprocess.run([sys.executable, "-m", "backend.extract", "--work-dir", str(dst), "--run-id", "ex",
                          "--input-run", input_run, "--verifier", verifier, "--aux-layer-ids",
                          ",".join(map(str, aux)), "--plan", str(plan)],
                         env=tmux_env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    expected = {"prepare-running": "extract: input_run: prepare run prep2 has not finished",
                "no-verifier": f"extract: verifier: verifier {tmp_path}/gone does not exist on this host",
                "layers-out-of-range": f"extract: aux_layer_ids: aux layer ids [4] are out of range for {tiny} (4 "
                                       f"decoder layers: valid ids are 0..3",
                "plan-other-layers": "extract: swap_plan: the plan starts the extraction server with aux layer ids "
                                     "[1, 2], the stage extracts [1, 2, 3]",
                "plan-without-final": "extract: swap_plan: the plan starts the extraction server with layer ids "
                                      "[1, 2, 3, 5], expected [1, 2, 3, 4]: "}[case]
    assert lines[0].startswith(expected), lines[0]
    assert not marker.exists()
    assert sorted(p.relative_to(dst) for p in dst.rglob("*")) == before


@pytest.mark.parametrize("asked", [[*AUX, LAYERS], AUX], ids=["aux-and-final", "aux-only"])
def test_endpoint_mode_uses_a_running_extraction_server_and_checks_the_width_it_writes(asked, tiny, work,
                                                                                     tmp_path_factory):
    """Without a plan the stage drives an extraction server that is already up (the operator's own). One
    started with the aux ids alone writes one state too few (vLLM appends none): the stage says so, naming
    what it expected and what it got, as soon as the first file is there."""
    from harness.sim_support import SimServer
    from harness.sim_support import extraction_flags

    env = stage_env(tmp_path_factory)
    server = SimServer(tmp_path_factory.mktemp("endpoint"), "--served-model-name", "tiny", "--text-backend",
                       "tinylm", "--stats-interval", "60", *extraction_flags(asked, tmp_path_factory.mktemp("hs")),
                       *(["--latency", "0.3"] if asked == AUX else []), env=env).start()
    run_id = f"ex-ep{len(asked)}"
    try:
        server.wait_ready(timeout=120)
        res = subprocess.run([sys.executable, "-m", "backend.extract", "--work-dir", str(work), "--run-id", run_id,
                              "--input-run", "prep", "--verifier", str(tiny), "--aux-layer-ids", "1,2,3",
                              "--endpoint", server.url, "--concurrency", "2", "--health-interval", "0.2"],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=200)
        summary = json.loads((work / f"runs/{run_id}/summary.json").read_text())
        assert summary["endpoint"] == server.url and "swap" not in summary
        assert summary["extract_layer_ids"] == [*AUX, LAYERS]
        if asked == AUX:
            assert res.returncode == 1 and summary["status"] == "failed"
            assert summary["error"].startswith(
                "the extraction server wrote 3 hidden states per token, expected 4 (layer ids [1, 2, 3, 4] asked "
                "for: aux layers [1, 2, 3] + the final layer 4 of a 64-wide verifier)"), summary["error"]
            assert summary["done"] < ROWS  # found on the first files, not after the whole extraction
        else:
            assert res.returncode == 0, res.stderr
            assert summary["status"] == "completed" and summary["done"] == ROWS
    finally:
        server.terminate()
        server.kill()


def test_rows_longer_than_the_extraction_servers_context_are_refused_up_front():
    from types import SimpleNamespace

    from backend.extract.runner import ExtractRunner, Side, StageFailed

    runner = ExtractRunner.__new__(ExtractRunner)
    runner.inputs = SimpleNamespace(sides=[Side("train", "/d", "train_hidden_states", 3, 300, 100, max_len=200)])
    runner.max_model_len = 200
    with pytest.raises(StageFailed, match=r"longest prepared row has 200 tokens but the extraction server's "
                                          r"max_model_len is 200 .* \[prepare\] seq_length <= 199"):
        runner._check_lengths()
    runner.max_model_len = 201
    runner._check_lengths()
