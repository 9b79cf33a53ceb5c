"""The profile's [train] section: defaults, clear errors, and the flags it hands the train stage."""
from __future__ import annotations

import pytest

from backend.train.config import parse_config
from console.profile import ProfileError, profile_from_dict

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
                     "train.gpus: expected a number from 0 to 1024", "train.epochs: expected an integer",
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
