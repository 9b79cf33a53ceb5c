"""Who holds which GPUs (backend/kit/gpu_owners.py), decided before anything starts: a table over host shapes.
Pure: no host, no processes."""
from __future__ import annotations

import pytest

from backend.kit.gpu_owners import BASELINE, EXTRACTION, TRAINER, HostShape, OwnershipError, plan_gpus
from console.control.gpu_plan import host_shape
from console.profile import profile_from_dict

CHAIN = ["generate", "prepare", "extract", "train", "verify"]
ONLINE_CHAIN = ["generate", "prepare", "train", "verify"]
ALL8 = tuple(range(8))

# name, shape, stages, online, chain -> (hold, loads, what must stop before each step, baseline down per step)
CASES = [
    # offline verify computes on the CPU: the baseline is back for it
    ("one GPU: server and trainer on GPU 0", HostShape(1, (0,), (0,)), CHAIN, False, True,
     (("extract", "train"), 2, [(), (), (BASELINE,), (), ()], [False, False, True, True, False])),
    ("TP8 holds all, training asks for one (the seed host)", HostShape(8, ALL8, (0,)), CHAIN, False, True,
     (("extract", "train"), 2, [(), (), (BASELINE,), (), ()], [False, False, True, True, False])),
    ("trainer on GPUs the server does not use", HostShape(8, (0, 1, 2, 3), (4, 5)), CHAIN, False, True,
     (None, 2, [(), (), (BASELINE,), (), ()], [False, False, True, False, False])),
    ("online with room: TP4 server, trainer on 4..7", HostShape(8, (0, 1, 2, 3), (4, 5, 6, 7)), ONLINE_CHAIN, True,
     True, (("train", "verify"), 3, [(), (), (BASELINE,), ()], [False, False, True, True])),
    ("online on the CPU", HostShape(8, ALL8, ()), ONLINE_CHAIN, True, True,
     (("train", "verify"), 3, [(), (), (BASELINE,), ()], [False, False, True, True])),
    ("one extract on its own", HostShape(8, ALL8, (0,)), ["extract"], False, False,
     (None, 2, [(BASELINE,)], [True])),
    ("a bench", HostShape(8, ALL8, (0,)), ["bench"], False, False, (None, 2, [(BASELINE,)], [True])),
    ("serve-drafter", HostShape(8, ALL8, (0,)), ["serve-drafter"], False, False, (None, 1, [(BASELINE,)], [True])),
]


@pytest.mark.parametrize("name, shape, stages, online, chain, expected", CASES, ids=[c[0] for c in CASES])
def test_gpu_plan_table(name, shape, stages, online, chain, expected):
    hold, loads, stops, down = expected
    plan = plan_gpus(shape, stages, online=online, chain=chain)
    assert plan.hold == hold
    assert plan.loads == loads
    assert [s.stops_first for s in plan.steps] == stops
    assert [s.baseline_down for s in plan.steps] == down
    for step in plan.steps:
        if step.baseline_down:
            assert BASELINE not in step.holders  # never two programs on the same GPUs
        owners = [set(ids) for ids in step.holders.values()]
        assert all(not (a & b) for i, a in enumerate(owners) for b in owners[i + 1:]), step


def test_the_seed_host_plan_says_who_holds_what_at_each_step():
    lines = plan_gpus(HostShape(8, ALL8, (0,)), CHAIN, chain=True).describe()
    assert lines[2] == "extract: extraction server on GPU 0,1,2,3,4,5,6,7 (first stop: baseline)"
    assert lines[3] == "train: trainer on GPU 0"
    assert lines[4] == "verify: baseline on GPU 0,1,2,3,4,5,6,7, verify on the CPU"
    assert "the baseline stays down from extract through train, started once after train" in lines[-1]


@pytest.mark.parametrize("shape", [HostShape(8, ALL8, (0,)), HostShape(1, (0,), (0,)), HostShape(8, (0, 1), (1, 2))])
def test_online_without_room_is_refused_when_planned_offering_offline_training(shape):
    with pytest.raises(OwnershipError, match=r"online train needs the extraction server and the trainer on "
                                             r"different GPUs.*or train offline \(--no-online"):
        plan_gpus(shape, ONLINE_CHAIN, online=True, chain=True)


def test_a_trainer_gpu_off_the_host_is_refused():
    with pytest.raises(OwnershipError, match=r"trainer's GPUs \[8\] are not all on a host of 8 GPUs"):
        HostShape(8, ALL8, (8,))


def profile(train: dict, tp: int = 8, count: int | None = None):
    data = {"host": {"name": "h.example"}, "paths": {"work_dir": "/w"}, "train": train,
            "server": {"model_path": "/m", "vllm_args": ["--tensor-parallel-size", str(tp)]}}
    if count:
        data["gpus"] = {"count": count}
    return profile_from_dict(data)


def test_the_host_shape_from_the_profile():
    assert host_shape(profile({"gpus": 1})) == HostShape(8, ALL8, (0,))  # the seed host
    assert host_shape(profile({})) == HostShape(8, ALL8, ALL8)  # unset: every GPU
    assert host_shape(profile({"gpus": 0})) == HostShape(8, ALL8, ())  # the CPU
    assert host_shape(profile({"gpus": [6, 7]}, tp=4, count=8)) == HostShape(8, (0, 1, 2, 3), (6, 7))
    assert host_shape(profile({"gpus": [9]})) == HostShape(10, ALL8, (9,))  # no [gpus] count: at least GPU 9
    assert host_shape(profile({"gpus": 2}, tp=1)).trainer == (0,)  # a 1-GPU host: the first of what there is


def test_train_gpus_by_index_reach_the_stage_which_sets_cuda_visible_devices():
    from backend.train.config import ConfigError, parse_config

    p = profile({"gpus": [6, 7]}, tp=4, count=8)
    args = p.train.stage_args()
    assert args[args.index("--gpu-ids") + 1] == "6,7" and "--gpus" not in args
    c = parse_config(["--work-dir", "/w", "--run-id", "r", "--verifier", "/v", *args])
    assert c.gpu_ids == [6, 7]
    with pytest.raises(ConfigError, match="--gpus 1 and --gpu-ids \\[6, 7\\] disagree"):
        parse_config(["--work-dir", "/w", "--run-id", "r", "--verifier", "/v", "--gpu-ids", "6,7", "--gpus", "1"])
    # the stage sets CUDA_VISIBLE_DEVICES before torch counts the GPUs (a preflight run shows what it saw)
    import subprocess, sys, json as _json
    from harness.sim_support import REPO
    code = ("import os, sys; import backend.train.__main__ as m; from backend.train import runner; "
            "runner.Stage.run = lambda self: print(os.environ['CUDA_VISIBLE_DEVICES'], self.c.gpus) or 0; "
            "sys.exit(m.main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", code, "--work-dir", "/w", "--run-id", "r", "--verifier", "/v",
                          "--gpu-ids", "6,7"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["6,7", "2"], out.stderr


# [train] gpus by index on a host whose TP8 baseline holds GPUs 0-7: overlapping indexes share the server's
# GPUs (the chain keeps the baseline down, online is refused naming them); indexes off the server's (a
# 16-GPU host) leave it serving while training runs, and online has room.
@pytest.mark.parametrize("gpus, count, hold, trainer_step", [
    ([6, 7], 8, ("extract", "train"), "train: trainer on GPU 6,7"),
    ([7, 8], 16, ("extract", "train"), "train: trainer on GPU 7,8"),
    ([8, 9, 10, 11], 16, None, "train: baseline on GPU 0,1,2,3,4,5,6,7, trainer on GPU 8,9,10,11"),
])
def test_tp8_holding_all_with_trainer_gpus_by_index(gpus, count, hold, trainer_step):
    from console.control.gpu_plan import gpu_plan

    p = profile({"gpus": gpus}, tp=8, count=count)
    assert host_shape(p) == HostShape(count, ALL8, tuple(gpus))
    plan = gpu_plan(p, CHAIN, online=False, chain=True)
    assert plan.hold == hold
    assert trainer_step in plan.describe()
    train = plan.steps[CHAIN.index("train")]
    assert train.baseline_down is (hold is not None) and train.holders[TRAINER] == tuple(gpus)
    if hold:
        shared = ",".join(str(i) for i in gpus if i < 8)
        with pytest.raises(OwnershipError, match=rf"both would use GPU {shared} .*\[train\] gpus asks for "
                                                 rf"GPU {','.join(map(str, gpus))}"):
            gpu_plan(p, ONLINE_CHAIN, online=True, chain=True)
    else:
        online = gpu_plan(p, ONLINE_CHAIN, online=True, chain=True)
        step = online.steps[ONLINE_CHAIN.index("train")]
        assert step.holders[EXTRACTION] == ALL8 and step.holders[TRAINER] == tuple(gpus)


def test_the_shipped_seed_profile_plans_its_pipeline():
    """The seed host's profile (TP8 holding all eight GPUs) runs `run pipeline` as shipped: offline, the
    baseline down once from extract through train; verify runs on the CPU with the baseline back."""
    from pathlib import Path

    from console.control.launch import StageRequest, request_gpu_plan
    from console.profile import load_profile

    p = load_profile(Path(__file__).resolve().parents[1] / "profiles" / "kimi-k25-int4.toml")
    req = StageRequest("pipeline")
    assert not req.is_online(p)
    plan = request_gpu_plan(req, p)
    assert plan.hold == ("extract", "train") and plan.loads == 2
