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
