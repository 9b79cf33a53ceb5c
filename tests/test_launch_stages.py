"""How the console starts each stage (console/control/launch.py, stage_argv.py): pure parts."""
from __future__ import annotations

import pytest

from backend.train.config import parse_config
from console.control import stage_argv
from console.control.launch import StageError, StageRequest, busy_stages, pipeline_range, stops_baseline
from console.profile import profile_from_dict

PROFILE = profile_from_dict({"host": {"name": "gpu-host.example"},
                             "server": {"model_path": "/models/kimi", "unit": "vllm-kimi"},
                             "paths": {"work_dir": "/data/eagle3", "python": "/opt/py/bin/python3"},
                             "drafter": {"num_speculative_tokens": 4}})


def test_pipeline_ranges():
    assert pipeline_range(StageRequest("pipeline")) == ["generate", "prepare", "extract", "train", "verify"]
    assert pipeline_range(StageRequest("pipeline", from_stage="train")) == ["train", "verify"]
    assert pipeline_range(StageRequest("pipeline", to_stage="prepare")) == ["generate", "prepare"]
    with pytest.raises(StageError, match="--from verify comes after --to prepare"):
        pipeline_range(StageRequest("pipeline", from_stage="verify", to_stage="prepare"))


@pytest.mark.parametrize("req, stops", [
    (StageRequest("extract"), True), (StageRequest("train"), False),
    (StageRequest("pipeline"), True), (StageRequest("pipeline", from_stage="train"), False),
    (StageRequest("pipeline", to_stage="prepare"), False),
])
def test_only_what_runs_an_extraction_stops_the_server(req, stops):
    assert stops_baseline(req) is stops


def test_train_and_verify_take_the_drafters_draft_tokens():
    argv = stage_argv.train_argv(PROFILE, "t1", "x1")
    assert argv[:3] == ["/opt/py/bin/python3", "-m", "backend.train"]
    config = parse_config(argv[3:])  # the stage's own parser accepts exactly what the console sends
    assert (config.run_id, config.input_run, config.verifier, config.speculative_tokens) == \
        ("t1", "x1", "/models/kimi", 4)
    verify = stage_argv.verify_argv(PROFILE, "v1", None)
    assert verify[verify.index("--speculative-tokens") + 1] == "4" and "--input-run" not in verify


@pytest.mark.parametrize("gpus, flag, value", [([4, 5, 6, 7], "--gpu-ids", "4,5,6,7"), (2, "--gpus", "2")])
def test_train_gpus_reach_the_train_stage_by_index_or_as_a_count(gpus, flag, value):
    p = profile_from_dict({"host": {"name": "gpu-host.example"}, "server": {"model_path": "/models/kimi"},
                           "paths": {"work_dir": "/data/eagle3"}, "train": {"gpus": gpus}})
    argv = stage_argv.train_argv(p, "t1", "x1")
    assert argv[argv.index(flag) + 1] == value and {"--gpus", "--gpu-ids"} & set(argv) == {flag}
    config = parse_config(argv[3:])
    assert (config.gpu_ids, config.gpus) == ((gpus, None) if flag == "--gpu-ids" else (None, gpus))


def test_the_default_input_and_aux_layers_are_asked_of_the_host():
    assert stage_argv.latest_argv(PROFILE, "extract")[-4:] == ["--work-dir", "/data/eagle3", "--stage", "extract"]
    assert stage_argv.aux_layers_argv(PROFILE)[-2:] == ["--ids", ""]


ONLINE = profile_from_dict({"host": {"name": "gpu-host.example"},
                            "server": {"model_path": "/models/kimi", "unit": "vllm-kimi", "served_model_name": "kimi"},
                            "paths": {"work_dir": "/data/eagle3"}, "extract": {"online": True}})


def test_training_is_offline_unless_the_profile_or_the_request_says_online():
    assert PROFILE.extract.online is False and not StageRequest("train").is_online(PROFILE)
    assert StageRequest("train").is_online(ONLINE) and StageRequest("train", online=True).is_online(PROFILE)
    assert not StageRequest("train", online=False).is_online(ONLINE)


def test_an_online_pipeline_has_no_extract_stage_and_still_stops_the_server():
    assert pipeline_range(StageRequest("pipeline"), ONLINE) == ["generate", "prepare", "train", "verify"]
    assert pipeline_range(StageRequest("pipeline", from_stage="extract"), ONLINE) == ["train", "verify"]
    assert pipeline_range(StageRequest("pipeline", online=False), ONLINE)[2] == "extract"
    with pytest.raises(StageError, match="online training has no extract stage"):
        pipeline_range(StageRequest("pipeline", from_stage="extract", to_stage="extract"), ONLINE)
    # the extraction server takes the baseline's GPUs while training online, and while verify fetches
    assert stops_baseline(StageRequest("train"), ONLINE) and stops_baseline(StageRequest("pipeline"), ONLINE)
    assert stops_baseline(StageRequest("train", online=True), PROFILE)
    assert not stops_baseline(StageRequest("pipeline", to_stage="prepare"), ONLINE)
    assert not stops_baseline(StageRequest("prepare"), ONLINE)


def test_online_train_and_verify_get_the_swap_plan_and_the_served_models_id():
    argv = stage_argv.train_argv(ONLINE, "t1", "p1", plan_file="/data/eagle3/plans/t1.extract.json")
    config = parse_config(argv[3:])
    assert config.online and config.plan == "/data/eagle3/plans/t1.extract.json" and config.served_model == "kimi"
    assert config.input_run == "p1" and config.vllm_endpoint is None  # the stage takes it from the plan
    verify = stage_argv.verify_argv(ONLINE, "v1", "t1", plan_file="/data/eagle3/plans/v1.extract.json")
    assert verify[verify.index("--plan") + 1] == "/data/eagle3/plans/v1.extract.json"
    assert verify[verify.index("--served-model") + 1] == "kimi"


def test_a_server_swap_never_starts_beside_another_swap_or_training():
    # each stage refuses a second run of itself and a pipeline run
    assert busy_stages(StageRequest("prepare"), PROFILE) == ["prepare", "pipeline"]
    assert busy_stages(StageRequest("train"), PROFILE) == ["train", "pipeline"]
    assert busy_stages(StageRequest("fetch_drafter"), PROFILE) == ["fetch_drafter"]  # no GPU: beside a pipeline
    # extraction, online training and the bench swap the servers: not beside one another, nor beside training
    swaps = {"extract", "bench", "train", "verify", "pipeline"}
    assert set(busy_stages(StageRequest("extract"), PROFILE)) == swaps
    assert set(busy_stages(StageRequest("bench"), PROFILE)) == swaps
    assert set(busy_stages(StageRequest("train", online=True), PROFILE)) == swaps
    assert set(busy_stages(StageRequest("pipeline"), PROFILE)) == swaps | {"generate", "prepare"}
