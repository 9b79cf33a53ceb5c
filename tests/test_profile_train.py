"""The profile's [train] section: defaults, clear errors, and the flags it hands the train stage."""
from __future__ import annotations

import tomllib

import pytest
import tomli_w

from backend.train.config import parse_config
from console.profile import ProfileError, load_profile, profile_from_dict

BASE = {"host": {"name": "gpu-host.example"}, "server": {"model_path": "/models/kimi"}, "paths": {"work_dir": "/w"}}


def test_defaults_are_speculators_defaults_and_round_trip_to_stage_flags():
    p = profile_from_dict(BASE)
    assert (p.train.epochs, p.train.learning_rate, p.train.optimizer, p.train.gpus) == (20, 1e-3, "muon", None)
    c = parse_config(["--verifier", "/models/kimi", *p.train.stage_args()])
    assert (c.epochs, c.lr, c.speculative_tokens, c.optimizer, c.gpus, c.draft_vocab_size) == (20, 1e-3, 3, "muon",
                                                                                                None, None)
    custom = profile_from_dict({**BASE, "train": {"draft_vocab_size": 32000, "gpus": 0, "checkpoint_freq": 0.25,
                                                  "extra_args": ["--ttt-step-loss-decay", "0.8"]}})
    c = parse_config(["--verifier", "/m", *custom.train.stage_args()])
    assert (c.draft_vocab_size, c.gpus, c.checkpoint_freq, c.extra_args) == (32000, 0, 0.25,
                                                                             ["--ttt-step-loss-decay", "0.8"])


def test_every_bad_key_is_named_at_once():
    with pytest.raises(ProfileError) as e:
        profile_from_dict({**BASE, "train": {"optimizer": "sgd", "gpus": -1, "epochs": "many",
                                             "extra_args": ["--save-path", "/x"], "learning_rat": 1}},
                         file="p.toml")
    text = str(e.value)
    for expected in ("p.toml: train.optimizer: expected one of 'muon', 'adamw'",
                     "train.gpus: expected a GPU count 0-1024 (0: the CPU) or a list of distinct GPU indexes "
                     "0-1023, got -1", "train.epochs: expected an integer",
                     "train.extra_args: expected speculators flags the stage does not set itself (--save-path",
                     "train.learning_rat: unknown key"):
        assert expected in text


def test_warm_start_acceptance_and_vocabulary_keys_reach_the_stage():
    p = profile_from_dict({**BASE, "train": {"from_pretrained": "train-7", "vocab_coverage": 0.95, "vocab_floor": 64,
                                             "acceptance_samples": 8, "acceptance_patience": 0}})
    c = parse_config(["--verifier", "/m", *p.train.stage_args()])
    assert (c.from_pretrained, c.vocab_coverage, c.vocab_floor, c.acceptance_samples, c.acceptance_patience) == (
        "train-7", 0.95, 64, 8, 0)
    d = parse_config(["--verifier", "/m", *profile_from_dict(BASE).train.stage_args()])
    assert (d.from_pretrained, d.vocab_coverage, d.vocab_floor, d.acceptance_samples, d.acceptance_patience) == (
        None, 0.99, 32000, 16, 3)
    assert parse_config(["--verifier", "/m", *profile_from_dict(
        {**BASE, "train": {"from_pretrained": "/srv/drafters/kimi-eagle3"}}).train.stage_args()]).from_pretrained
    with pytest.raises(ProfileError) as e:
        profile_from_dict({**BASE, "train": {"from_pretrained": "../x y"}}, file="p.toml")
    assert "train.from_pretrained: expected a train or fetch_drafter run id" in str(e.value)


def test_gpus_selects_gpus_by_index_and_reaches_the_stage_as_gpu_ids():
    p = profile_from_dict({**BASE, "train": {"gpus": [4, 5, 6, 7]}})
    assert p.train.gpus == [4, 5, 6, 7]
    args = p.train.stage_args()
    assert args[args.index("--gpu-ids") + 1] == "4,5,6,7" and "--gpus" not in args
    assert parse_config(["--verifier", "/m", *args]).gpu_ids == [4, 5, 6, 7]
    # it survives a write and a read (profile init, demo-host start write profiles back)
    again = profile_from_dict(tomllib.loads(p.to_toml()))
    assert again.train.gpus == [4, 5, 6, 7]


@pytest.mark.parametrize("count", [0, 1, 8])
def test_a_count_is_still_a_count(count):
    """gpus = N: the first N GPUs as before (0: the CPU); no index list reaches the stage."""
    args = profile_from_dict({**BASE, "train": {"gpus": count}}).train.stage_args()
    assert args[args.index("--gpus") + 1] == str(count) and "--gpu-ids" not in args
    c = parse_config(["--verifier", "/m", *args])
    assert (c.gpus, c.gpu_ids) == (count, None)


@pytest.mark.parametrize("value, shown", [
    ([1, 1], "[1, 1]"), ([-1, 2], "[-1, 2]"), ([1024], "[1024]"), ([], "[]"), (True, "True"), ([True], "[True]"),
    ("4,5,6,7", "'4,5,6,7'"), (["4"], "['4']"), (1025, "1025"), (-1, "-1"), (1.5, "1.5"),
])
def test_bad_gpus_are_refused_naming_file_and_key(value, shown):
    with pytest.raises(ProfileError) as e:
        profile_from_dict({**BASE, "train": {"gpus": value}}, file="p.toml")
    assert str(e.value) == ("p.toml: train.gpus: expected a GPU count 0-1024 (0: the CPU) or a list of distinct "
                            f"GPU indexes 0-1023, got {shown}")


def test_the_retired_gpu_ids_key_is_refused_with_what_to_write_instead(tmp_path):
    f = tmp_path / "old.toml"  # a profile written before gpus took indexes
    f.write_text(tomli_w.dumps({**BASE, "train": {"gpus": 2, "gpu_ids": [6, 7]}}))
    with pytest.raises(ProfileError) as e:
        load_profile(f)
    assert str(e.value) == (f"{f}: train.gpu_ids: retired key: [train] gpus selects GPUs by index now: replace "
                            "gpu_ids with gpus = [6, 7]")
    with pytest.raises(ProfileError) as e:  # the empty default an earlier `profile init` wrote: still named
        profile_from_dict({**BASE, "train": {"gpu_ids": []}}, file="p.toml")
    assert "p.toml: train.gpu_ids: retired key" in str(e.value) and "remove gpu_ids = []" in str(e.value)
    with pytest.raises(ProfileError) as e:  # a bad value: no copy of it offered as the thing to write
        profile_from_dict({**BASE, "train": {"gpu_ids": [1, 1]}}, file="p.toml")
    assert "replace gpu_ids with gpus = [..]" in str(e.value)


@pytest.mark.parametrize("gpus", [2, 8, [0, 1]])
def test_several_training_gpus_on_a_simulated_host_are_refused_by_key(gpus):
    """Simulated GPUs are counted but training computes on the CPU (one process): gpus >= 2 used to fail deep
    in speculators; the profile names the key and the reason at load."""
    with pytest.raises(ProfileError) as e:
        profile_from_dict({**BASE, "host": {"name": "gpu-host.example", "simulated": True}, "train": {"gpus": gpus}},
                          file="p.toml")
    assert "p.toml: train.gpus: expected 0 or 1 (or one index) on a simulated host" in str(e.value)
    assert "training computes on the CPU there, in one process" in str(e.value)
    for fine in (0, 1, [3], None):
        assert profile_from_dict({**BASE, "host": {"name": "gpu-host.example", "simulated": True},
                                  "train": {} if fine is None else {"gpus": fine}}).host.simulated
    assert profile_from_dict({**BASE, "train": {"gpus": gpus}}).train.gpus == gpus  # a real host: its GPUs
