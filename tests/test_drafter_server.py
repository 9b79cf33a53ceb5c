"""The drafter server's command line and unit (console/control/drafter_server.py) and the bench stage's
command line (console/control/bench_stage.py): exact argv for systemd and tmux hosts, the refusals, and
one real start in a private tmux server: the stand-in with the trained tiny drafter, found by its log."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time

import pytest

from console.control.bench_stage import bench_argv
from console.control.drafter_server import (DrafterServerError, drafter_command, drafter_start_command,
                                            drafter_stop_command, drafter_unit)
from console.control.units import tmux_start_argv, tmux_stop_argv
from console.profile import profile_from_dict

CKPT = "/data/eagle3/runs/train-1/checkpoints/checkpoint_best"
SPEC = '{"method":"eagle3","model":"%s","num_speculative_tokens":3,"draft_tensor_parallel_size":1}' % CKPT


def systemd_profile(**server):
    return profile_from_dict({
        "host": {"name": "gpu-host.example"},
        "server": {"model_path": "/shared/kimi-k2.5-int4", "unit": "vllm-kimi", "served_model_name": "kimi-k2.5",
                   "port": 8000, "reasoning_parser": "kimi_k2",
                   "vllm_args": ["-tp", "8", "--trust-remote-code", "--max-model-len", "262144"], **server},
        "paths": {"work_dir": "/data/eagle3", "python": "/opt/venv/bin/python"},
        "drafter": {"num_speculative_tokens": 3}})


def test_systemd_drafter_unit_argv():
    p = systemd_profile()
    assert drafter_unit(p) == "vllm-kimi-drafter"
    assert drafter_command(p, CKPT) == [
        "vllm", "serve", "/shared/kimi-k2.5-int4", "--host", "127.0.0.1", "--port", "8000", "--served-model-name",
        "kimi-k2.5", "--reasoning-parser", "kimi_k2", "-tp", "8", "--trust-remote-code", "--max-model-len", "262144",
        "--speculative-config", SPEC]
    start = drafter_start_command(p, CKPT, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert start.argv == [
        "systemd-run", "--unit=vllm-kimi-drafter", "--collect", "--quiet", "--working-directory=/data/eagle3",
        "--property=KillSignal=SIGTERM", "--property=TimeoutStopSec=120", "--setenv=CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7",
        *drafter_command(p, CKPT)]
    assert start.shown == shlex.join(start.argv)
    assert drafter_stop_command(p).argv == ["systemctl", "stop", "vllm-kimi-drafter"]
    sudo = systemd_profile(sudo=True)
    assert drafter_start_command(sudo, CKPT).argv[:3] == ["sudo", "-n", "systemd-run"]
    assert drafter_stop_command(sudo).argv == ["sudo", "-n", "systemctl", "stop", "vllm-kimi-drafter"]


def test_the_drafter_server_starts_from_the_operators_unit():
    """Its command line, environment (the caller's on top), files, user and directory are the unit's, whatever
    the profile's fields say; a secret-looking value is hidden in what the operator is shown."""
    from console.control.units import ServerProgram

    unit = ServerProgram(("/opt/venv/bin/vllm", "serve", "/shared/kimi-k2.5-int4", "-tp", "8", "--enable-expert-parallel"),
                         env=(("NCCL_P2P_DISABLE", "1"), ("HF_TOKEN", "hf_secret"), ("CUDA_VISIBLE_DEVICES", "all")),
                         env_files=(("/etc/default/vllm", False),), user="vllm", group="vllm",
                         working_dir="/srv/vllm", source="unit vllm-kimi.service", systemd_syntax=True)
    p = systemd_profile(vllm_args=["-tp", "4"])  # the profile's own arguments are not the drafter's
    assert drafter_command(p, CKPT, unit) == [*unit.argv, "--speculative-config", SPEC]
    start = drafter_start_command(p, CKPT, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, program=unit)
    assert start.argv == [
        "systemd-run", "--unit=vllm-kimi-drafter", "--collect", "--quiet", "--working-directory=/srv/vllm",
        "--property=KillSignal=SIGTERM", "--property=TimeoutStopSec=120", "--uid=vllm", "--gid=vllm",
        "--property=EnvironmentFile=/etc/default/vllm", "--setenv=NCCL_P2P_DISABLE=1", "--setenv=HF_TOKEN=hf_secret",
        "--setenv=CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7", *unit.argv, "--speculative-config", SPEC]
    assert "hf_secret" not in start.shown and "--setenv=HF_TOKEN=***" in start.shown
    # vLLM's own --api-key in the unit's ExecStart, a proxy password in its Environment=
    keyed = ServerProgram((*unit.argv, "--api-key", "sk-unit"), env=(("HTTPS_PROXY", "http://u:pw-unit@proxy.example"),),
                          source="unit vllm-kimi.service", systemd_syntax=True)
    for shown_text in (drafter_start_command(p, CKPT, program=keyed).shown,
                       drafter_start_command(systemd_profile(manager="tmux", command=["vllm", "serve"]), CKPT,
                                             program=keyed).shown):
        assert "sk-unit" not in shown_text and "pw-unit" not in shown_text and "--api-key '***'" in shown_text
    p.serve_drafter.draft_tensor_parallel_size = 4  # the target's TP is the unit's 8, not the profile's 4
    with pytest.raises(DrafterServerError, match=r"draft_tensor_parallel_size 4: .*\(8\)"):
        drafter_start_command(p, CKPT, program=unit)


def test_tmux_drafter_session_argv():
    p = profile_from_dict({
        "host": {"name": "localhost", "transport": "local"},
        "server": {"model_path": "/m", "manager": "tmux", "unit": "demo-vllm", "port": 18000, "stop_timeout_s": 20,
                   "command": ["python3", "-m", "sim.vllm_server", "--tensor-parallel-size", "8"]},
        "paths": {"work_dir": "/tmp/demo"}, "drafter": {"num_speculative_tokens": 4},
        "serve_drafter": {"draft_tensor_parallel_size": 8}})
    program = ["python3", "-m", "sim.vllm_server", "--tensor-parallel-size", "8", "--speculative-config",
               '{"method":"eagle3","model":"/ck","num_speculative_tokens":4,"draft_tensor_parallel_size":8}']
    assert drafter_command(p, "/ck") == program
    start = drafter_start_command(p, "/ck")
    # the stage builders' own tmux session: refuses a live one, fresh log beside the stages' logs
    assert start.argv == tmux_start_argv("demo-vllm-drafter", program, "/tmp/demo/logs/demo-vllm-drafter.log",
                                         cwd="/tmp/demo", env={})
    assert "tmux new-session -d -P -F '#{session_id}' -s demo-vllm-drafter -x 200" in start.argv[2]
    assert start.shown == f"tmux start session demo-vllm-drafter: {shlex.join(program)}"
    # the server's own stop timeout (20 s), not a stage's
    assert drafter_stop_command(p).argv == tmux_stop_argv("demo-vllm-drafter", 20)


@pytest.mark.parametrize("change, ckpt, why", [
    ({}, "relative/ckpt", "an absolute path"),
    ({}, "/ck\nrm -rf /", "a path of letters"),
    ({"vllm_args": ["--speculative-config", "{}"]}, CKPT, "already has --speculative-config"),
    ({"vllm_args": ["--speculative_config={}"]}, CKPT, "already has --speculative_config"),
])
def test_refusals(change, ckpt, why):
    with pytest.raises(DrafterServerError, match=why):
        drafter_command(systemd_profile(**change), ckpt)


def test_draft_tp_is_one_or_the_targets():
    p = profile_from_dict({"host": {"name": "gpu-host.example"},
                           "server": {"model_path": "/m", "vllm_args": ["--tensor-parallel-size=8"]},
                           "paths": {"work_dir": "/w"}, "serve_drafter": {"draft_tensor_parallel_size": 2}})
    with pytest.raises(DrafterServerError, match=r"takes 1 or the target's tensor-parallel size \(8\)"):
        drafter_command(p, CKPT)
    p.serve_drafter.draft_tensor_parallel_size = 8
    assert json.loads(drafter_command(p, CKPT)[-1])["draft_tensor_parallel_size"] == 8


def test_bench_argv():
    p = systemd_profile()
    assert bench_argv(p, "bench-2", label="drafter", input_run="prepare-1", baseline_run="bench-1") == [
        "/opt/venv/bin/python", "-m", "backend.bench", "--work-dir", "/data/eagle3", "--run-id", "bench-2",
        "--endpoint", "http://127.0.0.1:8000", "--model", "kimi-k2.5", "--input-run", "prepare-1",
        "--label", "drafter", "--concurrency", "1,4,16", "--num-prompts", "200",
        "--temperature", "0", "--seed", "0", "--client", "auto", "--ready-timeout", "3600",
        "--tokenizer", "/shared/kimi-k2.5-int4", "--trust-remote-code", "--baseline-run", "bench-1",
        "--split-prompts", "4"]
    # the baseline's bench has no drafter to split or to read against the reference
    assert "--split-prompts" not in bench_argv(p, "bench-1", label="baseline", input_run="prepare-1")
    p.bench.reference_acceptance, p.bench.reference_k, p.bench.split_prompts = 2.88, 3, 0
    argv = bench_argv(p, "bench-2", label="drafter", input_run="prepare-1", baseline_run="bench-1")
    assert argv[-4:] == ["--reference-acceptance", "2.88", "--reference-k", "3"]
    assert "--split-prompts" not in argv
    with pytest.raises(ValueError, match="no prompts"):
        bench_argv(p, "b", label="baseline")


# ---- one real start: the demo's way, a private tmux server --------------------------------------------------
def test_drafter_session_starts_the_stand_in_with_the_drafter(tiny_drafters, tmp_path):
    from harness.sim_support import PYTHON, free_port

    work = tmp_path / "w"
    (work / "tmux").mkdir(parents=True)
    os.chmod(work / "tmux", 0o700)
    port = free_port()
    p = profile_from_dict({
        "host": {"name": "localhost", "transport": "local"},
        "server": {"model_path": "/shared/tiny", "manager": "tmux", "unit": "e3t-vllm", "port": port,
                   "served_model_name": "tiny", "stop_timeout_s": 20,
                   "command": [*PYTHON, "-m", "sim.vllm_server", "--host", "127.0.0.1", "--port", str(port),
                               "--model", "/shared/tiny", "--served-model-name", "tiny", "--load-seconds", "0.3",
                               "--shards", "2", "--text-backend", "tinylm"]},
        "paths": {"work_dir": str(work)}})
    env = {**os.environ, "TMUX_TMPDIR": str(work / "tmux"), "XDG_CACHE_HOME": str(tiny_drafters.xdg),
           "HF_HUB_OFFLINE": "1"}
    env.pop("TMUX", None)
    start = drafter_start_command(p, str(tiny_drafters.trained))
    assert subprocess.run(start.argv, env=env, capture_output=True, text=True, timeout=60).returncode == 0
    log = work / "logs" / "e3t-vllm-drafter.log"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = log.read_text() if log.exists() else ""
            if "Application startup complete." in text or "EngineCore failed" in text:
                break
            time.sleep(0.2)
        # vLLM 0.33's V2 model runner: no drafter line of its own, the Eagle3 aux layers it hands over
        assert "Using Eagle3 auxiliary layers from config: (1, 2, 3)" in text and "Loading drafter model" not in text
        assert "Application startup complete." in text, text[-3000:]
    finally:
        stop = subprocess.run(drafter_stop_command(p).argv, env=env, capture_output=True, text=True, timeout=60)
        subprocess.run(["tmux", "kill-server"], env=env, capture_output=True, timeout=30)
    assert stop.returncode == 0 and "[shutdown]" in log.read_text()


def test_the_bench_plan_names_the_published_drafter_as_third():
    from console.control.bench_pair import pair_plan

    p = profile_from_dict({
        "host": {"name": "localhost", "transport": "local"},
        "server": {"model_path": "/m", "manager": "tmux", "unit": "demo-vllm", "port": 18000,
                   "command": ["python3", "-m", "sim.vllm_server"]},
        "paths": {"work_dir": "/tmp/demo"}, "bench": {"dataset": "/data/p.jsonl"}})
    plain = pair_plan(p, "b1", "/ck")
    assert [c["server"] for c in plain["contenders"]] == ["drafter"]
    assert "third_checkpoint" not in plain and "--third-run" not in plain["contenders"][0]["argv"]
    plan = pair_plan(p, "b1", "/ck", third_checkpoint="/published")
    # the published drafter runs in the drafter server's own unit, with its checkpoint; ours is compared to both
    away = {s["name"]: s for s in plan["switch"]["away"]}
    assert list(away) == ["third", "drafter"]  # benched in this order, one switch
    assert away["third"]["start"] == drafter_start_command(p, "/published").argv
    assert away["drafter"]["start"] == drafter_start_command(p, "/ck").argv
    assert away["third"]["unit"] == away["drafter"]["unit"] == "demo-vllm-drafter"
    assert plan["switch"]["home"]["unit"] == "demo-vllm"
    third, drafter = plan["contenders"]
    assert (third["server"], third["ours"], drafter["server"], drafter["ours"]) == ("third", False, "drafter", True)
    assert third["run_id"] == "b1-third" and third["argv"][-4:-2] == ["--baseline-run", "b1-baseline"]
    argv = drafter["argv"]
    assert argv[argv.index("--third-run") + 1] == "b1-third" and argv[argv.index("--baseline-run") + 1] == "b1-baseline"


def _spec_of(argv: list[str]) -> dict:
    """The --speculative-config a drafter server's command line carries (its JSON may sit in a shell script)."""
    text = " ".join(argv)
    start = text.index('{"method"')
    return json.JSONDecoder().raw_decode(text[start:].replace('\\"', '"'))[0]


def test_a_bench_of_several_k_starts_the_drafter_server_once_per_k():
    from backend.benchpair import STAGE as PAIR_STAGE
    from console.control import stages
    from console.control.bench_pair import drafter_loads, drafter_starts_text, pair_plan
    from console.session import Session

    p = profile_from_dict({
        "host": {"name": "localhost", "transport": "local"},
        "server": {"model_path": "/m", "manager": "tmux", "unit": "demo-vllm", "port": 18000,
                   "command": ["python3", "-m", "sim.vllm_server"]},
        "paths": {"work_dir": "/tmp/demo"},
        "bench": {"dataset": "/data/p.jsonl", "k_values": [2, 4], "third_drafter": "org/published-eagle3"}})
    plan = pair_plan(p, "b1", "/ck", k_values=[2, 4], third_checkpoint="/published")
    # benched in order through the one switch: the published drafter, then ours at each K, one start each
    assert [(c["server"], c["run_id"], c["title"], c["k"], c["ours"]) for c in plan["contenders"]] == [
        ("third", "b1-third", "published drafter", 3, False),
        ("drafter_k2", "b1-k2", "drafter (K=2)", 2, True), ("drafter_k4", "b1-k4", "drafter (K=4)", 4, True)]
    away = {s["name"]: s for s in plan["switch"]["away"]}
    assert list(away) == ["third", "drafter_k2", "drafter_k4"]
    assert {s["unit"] for s in away.values()} == {"demo-vllm-drafter"}
    for k in (2, 4):
        assert _spec_of(away[f"drafter_k{k}"]["command"])["num_speculative_tokens"] == k
        assert away[f"drafter_k{k}"]["start"] == drafter_start_command(p, "/ck", k=k).argv
        argv = plan["contenders"][1 + (k == 4)]["argv"]
        assert argv[argv.index("--label") + 1] == f"drafter-k{k}"
        assert argv[argv.index("--baseline-run") + 1] == "b1-baseline" and "--third-run" in argv
    assert _spec_of(away["third"]["command"])["num_speculative_tokens"] == 3  # the profile's K
    # the cost, said before it is spent: a drafter server start per K (and the published one), the baseline back
    assert drafter_loads(p, [2, 4]) == 3 and drafter_loads(p) == 2
    assert drafter_starts_text(p, [2, 4]) == "3 drafter server starts (K=2, K=4, the published drafter)"
    said = Session(p).downtime(stages.of_run(PAIR_STAGE).name)  # the profile's [bench].k_values
    assert said.startswith("3 drafter server starts (K=2, K=4, the published drafter) and the baseline's "
                           "restart: 4 server loads"), said
    with pytest.raises(ValueError, match=r"K values \[2, 2\]: expected at most 8 distinct K values"):
        pair_plan(p, "b1", "/ck", k_values=[2, 2])


def test_k_values_are_checked_where_they_are_asked_for(tmp_path):
    from console.control.bench_pair import check_against_trained
    from console.profile import ProfileError, parse_k_values

    base = {"host": {"name": "localhost", "transport": "local"}, "server": {"model_path": "/m"},
            "paths": {"work_dir": "/tmp/demo"}}
    for bad in ([0, 2], [2, 2], [33], list(range(1, 10))):
        with pytest.raises(ProfileError, match=r"^k\.toml: bench\.k_values: expected at most 8 distinct K values "
                                               r"\(draft tokens per step\) from 1 to 32, got"):
            profile_from_dict({**base, "bench": {"k_values": bad}}, file="k.toml")
    assert parse_k_values("2,3,4") == [2, 3, 4]
    for text, says in (("2,x", "expected K values separated by commas"), ("3,3", "at most 8 distinct"),
                       ("", "separated by commas"), ("0", "from 1 to 32")):
        with pytest.raises(ValueError, match=says):
            parse_k_values(text)
    # past the K the drafter was trained for: refused, naming where they were asked and the bound
    check_against_trained([2, 3], 3, "/ck", "--k")
    check_against_trained([5], None, "/ck", "--k")  # a checkpoint that does not say: vLLM's bound only
    with pytest.raises(ValueError, match=r"^p\.toml: bench\.k_values \[2, 4, 5\]: the drafter /ck was trained for "
                                         r"K=3 .*bench K values 1\.\.3, not 4, 5$"):
        check_against_trained([2, 4, 5], 3, "/ck", "p.toml: bench.k_values")
