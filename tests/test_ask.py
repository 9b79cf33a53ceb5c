"""The host's one entry point for the console's questions (backend/ask.py): latest run of a stage, aux layers
of a verifier, the servable checkpoint; an answer that cannot be given is one line on stderr, exit 2."""
from __future__ import annotations

import json

from backend.ask import main
from harness.train_support import completed_run


def test_latest_run_of_a_stage(tmp_path, capsys):
    completed_run(tmp_path, "prepare", "p1", {"train_data": "/x"})
    assert main(["latest", "--work-dir", str(tmp_path), "--stage", "prepare"]) == 0
    assert capsys.readouterr().out.strip() == "p1"
    assert main(["latest", "--work-dir", str(tmp_path), "--stage", "extract"]) == 2
    assert "no completed extract run" in capsys.readouterr().err


def test_aux_layers_of_a_verifier(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 8, "hidden_size": 16,
                                                      "vocab_size": 100}))
    assert main(["aux-layers", "--verifier", str(tmp_path)]) == 0
    # the server is asked for the aux ids plus the final layer (speculators reads that state last)
    assert json.loads(capsys.readouterr().out) == {"aux_layer_ids": [2, 4, 5], "num_layers": 8,
                                                   "extract_layer_ids": [2, 4, 5, 8]}
    assert main(["aux-layers", "--verifier", str(tmp_path), "--ids", "1,9"]) == 2
    assert "out of range" in capsys.readouterr().err
    assert main(["aux-layers", "--verifier", str(tmp_path), "--ids", "x"]) == 2
    assert "expected comma-separated integers" in capsys.readouterr().err


def test_the_servable_checkpoint(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    assert main(["servable", "--work-dir", str(tmp_path)]) == 2
    assert "no verified drafter" in capsys.readouterr().err
    completed_run(tmp_path, "verify", "v1", {"checkpoint": str(ckpt)})
    assert main(["servable", "--work-dir", str(tmp_path)]) == 0
    # a checkpoint whose config does not say its K: no bound on the K values a bench may ask for
    assert json.loads(capsys.readouterr().out) == {"run_id": "v1", "stage": "verify", "checkpoint": str(ckpt),
                                                   "trained_k": None, "max_position_embeddings": None}
    (ckpt / "config.json").write_text(json.dumps({"speculators_config": {"proposal_methods": [
        {"speculative_tokens": 3}]}, "transformer_layer_config": {"max_position_embeddings": 2048}}))
    assert main(["servable", "--work-dir", str(tmp_path)]) == 0
    found = json.loads(capsys.readouterr().out)
    # the context it was built for: run bench refuses a longer served --max-model-len without --yes
    assert (found["trained_k"], found["max_position_embeddings"]) == (3, 2048)
    (ckpt / "config.json").unlink()
    ckpt.rmdir()
    assert main(["servable", "--work-dir", str(tmp_path)]) == 2
    assert "no longer on this host" in capsys.readouterr().err
