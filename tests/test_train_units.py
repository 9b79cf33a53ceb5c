"""The train and verify stages' parts, without training: adapters, metrics capture, preflight parsers,
stage flags, acceptance counting, the console's train view, and the checkpoint checks."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from typing import Any

import pytest

from backend.kit.preflight import PreflightReport
from backend.train import preflight
from backend.train.config import ConfigError, parse_config
from backend.train.metrics import MetricsHandler, positional
from console.telemetry.train_view import TrainSeries

SAMPLES = Path(__file__).parent / "samples" / "nvidia_smi"


# ---- device adapters ------------------------------------------------------------------------------------
@pytest.fixture
def adapters(torch):
    from backend.drafter import adapters

    return adapters


def test_device_adapters_apply_only_without_an_accelerator_and_are_undone(monkeypatch, adapters):
    from speculators.train import checkpointer, trainer

    timer, device = trainer._StepTimer, checkpointer.get_current_device
    assert not adapters.accelerator_present()  # this machine: CPU only
    with adapters.no_accelerator() as applied:
        assert len(applied) == 2
        assert trainer._StepTimer is not timer and checkpointer.get_current_device() == "cpu"
        t = trainer._StepTimer(enabled=True)
        t.mark("start")  # stock speculators raises "Cannot access accelerator device" here
        assert t.now() is not None
    assert trainer._StepTimer is timer and checkpointer.get_current_device is device
    with pytest.raises(RuntimeError, match="accelerator"):
        timer(enabled=True).mark("start")  # the assumption the adapter handles is real
    monkeypatch.setattr(adapters, "accelerator_present", lambda: True)
    with adapters.no_accelerator() as applied:
        assert applied == [] and trainer._StepTimer is timer  # on a GPU host speculators runs untouched


def test_an_adapter_names_what_moved_when_speculators_changes(monkeypatch, adapters):
    from speculators.train import checkpointer

    monkeypatch.delattr(checkpointer, "get_current_device")
    with pytest.raises(adapters.AdapterError, match="get_current_device is gone"):
        with adapters.no_accelerator():
            pass


def test_host_device_and_autocast_fall_back_to_the_cpu(adapters, torch):
    assert adapters.host_device(3) == torch.device("cpu") and adapters.autocast_device_type() == "cpu"


def test_the_cpu_computes_in_float32_and_autocast_says_nothing_about_it(adapters, torch):
    """auto: bfloat16 on GPUs (speculators' default), float32 on the CPU; an explicit choice stands. torch's
    CPU autocast to float32 runs without autocast, and its warning that it does is silenced on the CPU."""
    import warnings

    from backend.train.config import resolved_dtype
    from backend.train.plan import speculators_argv

    assert [resolved_dtype("auto", cpu) for cpu in (True, False)] == ["float32", "bfloat16"]
    assert resolved_dtype("bfloat16", True) == "bfloat16" and resolved_dtype("float32", False) == "float32"
    with pytest.raises(ConfigError, match="auto, bfloat16 or float32"):
        parse_config(["--verifier", "/v", "--hidden-states-dtype", "float16"]).validate()
    c = parse_config(["--verifier", "/v"])
    for cpu, dtype in ((True, "float32"), (False, "bfloat16")):
        argv = speculators_argv(c, train_data="d", hidden_states="h", save_path="s", layer_ids=[1, 2, 3],
                                vocab=None, remote_code=False, cpu=cpu, num_workers=0, log_dir="l", cache_dir="c")
        assert argv[argv.index("--hidden-states-dtype") + 1] == dtype
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with adapters.no_accelerator(), torch.autocast("cpu", dtype=torch.float32):
            torch.ones(2, 2) @ torch.ones(2, 2)
        assert not [w for w in caught if "autocast" in str(w.message)], [str(w.message) for w in caught]
        with torch.autocast("cpu", dtype=torch.float32):  # outside the adapter torch says it
            pass
        assert [w for w in caught if "autocast" in str(w.message)]


# ---- metrics capture ------------------------------------------------------------------------------------
def _record(msg, **extra) -> logging.LogRecord:
    record = logging.LogRecord("speculators.metrics", logging.INFO, __file__, 1, msg, None, None)
    record.__dict__.update(extra)
    return record


def test_metrics_handler_turns_speculators_dicts_into_progress_events():
    events = []
    clock = iter([100.0, 101.0, 103.0])
    h = MetricsHandler(lambda kind, **d: events.append((kind, d)), clock=lambda: next(clock))
    h.set_plan(total_steps=10, steps_per_epoch=5)
    h.emit(_record({"lr": 0.001}, hparams=True))  # the resolved config: ignored
    h.emit(_record("a plain message"))
    for step in (0, 1, 2):  # the dict speculators' Trainer logs per step (after normalize_counted_metrics)
        h.emit(_record({"train": {"loss": 9.0 - step, "loss_0": 3.0, "loss_1": 3.0, "loss_2": 3.0 - step,
                                  "full_acc_0": 0.5, "full_acc_1": 0.25, "full_acc_2": 0.125,
                                  "cond_acc_0": 0.5, "cond_acc_1": 0.5, "cond_acc_2": 0.5, "error_records": 0.0},
                        "profile": {"tokens_per_s": 1000.0, "step_ms": 50.0}, "epoch": 0,
                        "lr": {"Muon": 0.02, "AdamW": 0.001}, "global_step": step}, step=step))
    h.emit(_record({"val": {"loss_epoch": 4.5, "loss_0_epoch": 1.5, "full_acc_0_epoch": 0.6,
                            "full_acc_1_epoch": 0.3}, "epoch": 0}, step=5))
    assert [k for k, _ in events] == ["progress"] * 4
    first, last, val = events[0][1], events[2][1], events[3][1]
    assert first == {"phase": "train", "step": 0, "done": 1, "total": 10, "epoch": 0, "loss": 9.0,
                     "loss_k": [3.0, 3.0, 3.0], "acc_k": [0.5, 0.25, 0.125], "cond_acc_k": [0.5, 0.5, 0.5],
                     "lr": 0.02, "lr_groups": {"Muon": 0.02, "AdamW": 0.001}, "rate": None, "eta_s": None,
                     "tokens_per_s": 1000.0, "step_ms": 50.0}
    assert last["rate"] == pytest.approx(2 / 3, abs=1e-3) and last["eta_s"] == pytest.approx(10.5)
    assert val == {"phase": "val", "epoch": 0, "val_loss": 4.5, "val_loss_k": [1.5], "val_acc_k": [0.6, 0.3],
                   "step": 4, "done": 5, "total": 10}


def test_a_broken_metric_never_raises_into_training(monkeypatch):
    def boom(kind, **data):
        raise OSError("disk full")

    h = MetricsHandler(boom)
    monkeypatch.setattr(logging, "raiseExceptions", False)
    h.emit(_record({"train": {"loss": 1.0}, "global_step": 0}))  # no exception


def test_positional_ignores_non_numbers_and_other_suffixes():
    assert positional({"loss_0": float("nan"), "loss_1": "x", "full_acc_0_epoch": 1.0}) == {"loss_k": [None, None]}


# ---- preflight ------------------------------------------------------------------------------------------
def test_compute_apps_and_uuids_parse_real_nvidia_smi_output():
    apps = preflight.parse_compute_apps((SAMPLES / "compute_apps_vllm.csv").read_text())
    assert [(a.pid, a.used_mib) for a in apps] == [(48213, 131072), (48213, 131072), (50111, None)]
    uuids = preflight.parse_gpu_uuids((SAMPLES / "gpu_uuids.csv").read_text())
    assert len(uuids) == 4 and uuids[3].endswith("1c04")
    busy = preflight.holders(apps, uuids, [0, 1], own_pid=1)
    assert [(i, a.pid) for i, a in busy] == [(0, 48213), (1, 48213)]
    assert preflight.holders(apps, uuids, [3], own_pid=1) == []
    assert preflight.parse_compute_apps("No running processes found\n") == []


def test_gpu_check_names_the_shortfall_and_the_cpu_case():
    report = PreflightReport()
    preflight.check_gpus(report, 0, 0)
    preflight.check_gpus(report, 8, 2)
    assert report.checks[0].ok and "CPU" in report.checks[0].detail
    assert not report.checks[1].ok and "8 GPUs requested, 2 visible" in report.checks[1].detail


def test_missing_modules_say_how_to_install():
    report = PreflightReport()
    preflight.check_modules(report, ("torch", "no_such_module_xyz"))
    assert not report.ok and "eagle3-console[train]" in report.checks[0].fix


# ---- stage flags ----------------------------------------------------------------------------------------
def test_flags_parse_and_bad_values_are_one_line_errors():
    c = parse_config(["--verifier", "/m", "--aux-layer-ids", "1, 2,3", "--extra-args", "--ttt-step-loss-decay 0.8"])
    assert c.aux_layer_ids == [1, 2, 3] and c.extra_args == ["--ttt-step-loss-decay", "0.8"] and not c.online
    assert parse_config(["--verifier", "/m", "--aux-layer-ids", "[0, 5]"]).aux_layer_ids == [0, 5]
    for argv, msg in ((["--epochs", "3"], "--verifier is required"),
                      (["--verifier", "/m", "--epochs", "0"], "--epochs must be >= 1"),
                      (["--verifier", "/m", "--aux-layer-ids", "a,b"], "layer ids"),
                      (["--verifier", "/m", "--vllm-endpoint", "ftp://x"], "http"),
                      (["--verifier", "/m", "--extra-args", "--save-path /x"], "may not set --save-path"),
                      (["--verifier", "/m", "--bogus"], "unrecognized")):
        with pytest.raises(ConfigError, match=msg):
            parse_config(argv)


# ---- acceptance counting --------------------------------------------------------------------------------
def test_chain_acceptance_counts_leading_accepted_tokens_only(torch):
    from backend.drafter.acceptance import Acceptance, chain_accepted

    targets = torch.tensor([5, 6, 7, 8, 9])
    # step j at anchor i proposes for position i + j
    proposals = torch.tensor([[5, 0, 7, 8, 0],    # step 0 (for position i): right at anchors 0, 2
                              [6, 7, 0, 9, 0],    # step 1 (position i + 1): right at anchors 0, 1
                              [0, 8, 9, 0, 0]])   # step 2 (position i + 2): right at anchors 1, 2
    supervised = torch.ones(5, dtype=torch.bool)
    got = chain_accepted(proposals, targets, supervised)  # anchors 0..2 have all 3 positions
    assert got.tolist() == [2, 0, 1]  # anchor 1: step 0 wrong, so its later right guesses do not count
    supervised[0] = False
    assert chain_accepted(proposals, targets, supervised).tolist() == [0, 1]
    a = Acceptance(k=3)
    a.add(torch.tensor([2, 0, 1, 3]))
    assert a.histogram == [1, 1, 1, 1] and a.per_position == [0.75, 0.5, 0.25]
    assert a.mean_accepted == pytest.approx(1.5) and a.mean_acceptance_length == pytest.approx(2.5)


# ---- the console's view of a train run ------------------------------------------------------------------
def test_train_series_drops_superseded_steps_and_decimates():
    s = TrainSeries()
    s.apply("progress", {"phase": "plan", "total": 100, "steps_per_epoch": 50})
    for step in range(8):
        s.apply("progress", {"phase": "train", "step": step, "loss": 10.0 - step, "epoch": 0, "acc_k": [0.5]})
    s.apply("progress", {"phase": "checkpoint", "checkpoint": "/c/0", "checkpoint_kind": "mid_epoch", "step": 4})
    s.apply("progress", {"phase": "checkpoint", "checkpoint": "/c/0", "checkpoint_kind": "mid_epoch", "step": 6})
    s.apply("resume", {"step": 5, "epoch": 0, "checkpoint": "/c/0"})  # the kill -9 lost steps 5..7
    assert [p[0] for p in s.loss] == [0, 1, 2, 3, 4] and s.resumed_from == 5
    assert s.to_dict()["last_checkpoint"]["step"] == 4
    for step in range(5, 9000):
        s.apply("progress", {"phase": "train", "step": step, "loss": 1.0})
    assert len(s.loss) <= 4000 and s.loss[-1][0] >= 8990
    sent = s.to_dict()
    assert len(sent["loss"]) <= 401 and sent["loss"][-1][0] == s.loss[-1][0] and sent["total"] == 100


# ---- checkpoint checks ----------------------------------------------------------------------------------
def _fake_checkpoint(path: Path, *, d2t: Any, t2d: Any, ids=(1, 2, 3), draft_vocab=4) -> Path:
    import torch
    from safetensors.torch import save_file

    path.mkdir()
    config = {"speculators_model_type": "eagle3", "draft_vocab_size": draft_vocab,
              "eagle_aux_hidden_state_layer_ids": list(ids),
              "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"speculative_tokens": 3}],
                                     "verifier": {"name_or_path": "/nowhere", "architectures": ["LlamaForCausalLM"]}},
              "transformer_layer_config": {"model_type": "llama", "hidden_size": 8, "vocab_size": 10}}
    (path / "config.json").write_text(json.dumps(config))
    tensors = {"fc.weight": torch.zeros(8, 8 * len(ids)), "norm.weight": torch.ones(8),
               "lm_head.weight": torch.zeros(draft_vocab, 8), "layers.0.self_attn.q_proj.weight": torch.zeros(8, 16)}
    if d2t is not None:
        tensors["d2t"], tensors["t2d"] = d2t, t2d
    save_file(tensors, str(path / "model.safetensors"))
    return path


def test_checks_catch_a_bad_mapping_out_of_range_layers_and_a_missing_verifier(tmp_path, torch):
    from backend.drafter import checks
    from backend.drafter.verifier import VerifierInfo

    info = VerifierInfo(path=str(tmp_path), architectures=["LlamaForCausalLM"], model_type="llama", nested=False,
                        remote_code=False, num_layers=4, hidden_size=8, vocab_size=10)
    t2d = torch.zeros(10, dtype=torch.bool)
    t2d[[0, 3, 4, 9]] = True
    good = _fake_checkpoint(tmp_path / "good", d2t=torch.tensor([0, 2, 2, 6]), t2d=t2d)
    bad = _fake_checkpoint(tmp_path / "bad", d2t=torch.tensor([0, 2, 1, 6]), t2d=t2d, ids=(1, 2, 4))
    for ckpt, ok in ((good, True), (bad, False)):
        report = PreflightReport()
        config = json.loads((ckpt / "config.json").read_text())
        keys = checks.header(str(ckpt))
        checks.check_format(report, str(ckpt), config, keys)
        checks.check_layer_ids(report, config, info, keys)
        checks.check_vocab(report, str(ckpt), config, info, keys)
        checks.check_verifier(report, str(ckpt), config, info)
        by = {c.name: c for c in report.checks}
        assert by["speculators_format"].ok
        assert by["aux_layer_ids"].ok is ok and by["draft_vocab"].ok is ok
        assert not by["verifier"].ok and "does not exist on this host" in by["verifier"].detail
    by = {c.name: c for c in report.checks}
    assert "outside 0..3" in by["aux_layer_ids"].detail and "not strictly increasing" in by["draft_vocab"].detail
