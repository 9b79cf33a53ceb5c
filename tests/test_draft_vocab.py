"""The default draft vocabulary comes from the prepare run's token frequencies (backend/train/vocab.py)."""
from __future__ import annotations

import pytest

from backend.train import vocab as vb

# 10 tokens seen: counts 50, 20, 10, 8, 5, 3, 2, 1, 1, 0 (total 100)
FREQ = {7: 50, 3: 20, 9: 10, 1: 8, 4: 5, 2: 3, 8: 2, 5: 1, 6: 1, 0: 0}


def test_the_smallest_size_covering_the_share_then_the_floor_and_the_verifiers_vocabulary():
    assert vb.by_coverage(FREQ, 512, share=0.8, floor=2).size == 3  # 50+20+10 = 80
    assert vb.by_coverage(FREQ, 512, share=0.81, floor=2).size == 4  # 88
    c = vb.by_coverage(FREQ, 512, share=0.9, floor=2)
    assert (c.size, c.coverage, c.chosen_by, c.distinct) == (5, 0.93, "coverage", 10)
    assert vb.by_coverage(FREQ, 512, share=0.8, floor=6).size == 6  # the floor wins
    full = vb.by_coverage(FREQ, 8, share=0.8, floor=32000)
    assert full.size == 8 and full.full  # never above the verifier's vocabulary
    assert vb.by_coverage(FREQ, 512, share=1.0, floor=2).size == 9  # every token seen with a count
    text = vb.by_coverage(FREQ, 512, share=0.9, floor=2).describe()
    assert text == ("draft vocabulary 5 of 512 tokens (the smallest that covers 90.00% (floor 2), covering 93.00% "
                    "of the supervised tokens)")


def test_a_given_size_reports_its_coverage_and_bad_frequencies_are_refused():
    g = vb.given(FREQ, 512, 2)
    assert (g.size, g.coverage, g.chosen_by) == (2, 0.7, "given")
    assert vb.given(None, 512, 1000).size == 512
    with pytest.raises(ValueError, match="mapping"):
        vb.counts([1, 2])
    with pytest.raises(ValueError, match="negative"):
        vb.counts({1: -1})


def test_the_train_stage_resolves_the_default_before_it_trains(tmp_path):
    """The stage's inputs choose the size from the input run's token_freq and pass it on as the flag."""
    import torch

    from backend.train.config import parse_config
    from backend.train.runner import choose_vocab

    path = tmp_path / "token_freq.pt"
    torch.save(FREQ, path)

    class Info:
        vocab_size = 512

    class Run:
        stage, run_id = "extract", "x"

    class Inputs:
        token_freq, warm, info, run = str(path), None, Info(), Run()

    c = parse_config(["--verifier", "/m", "--vocab-coverage", "0.9", "--vocab-floor", "4"])
    assert choose_vocab(c, Inputs()).size == 5
    c = parse_config(["--verifier", "/m", "--draft-vocab-size", "3"])
    assert choose_vocab(c, Inputs()).chosen_by == "given"
    Inputs.token_freq = None
    assert choose_vocab(parse_config(["--verifier", "/m"]), Inputs()).chosen_by == "no token frequencies"


def test_every_choice_describes_itself():
    for choice in (vb.given(FREQ, 512, 3), vb.given(None, 512, 600),
                   vb.VocabChoice(size=512, vocab=512, coverage=None, chosen_by="no token frequencies"),
                   vb.VocabChoice(size=256, vocab=512, coverage=0.5, chosen_by="warm start")):
        assert choice.describe().startswith(f"draft vocabulary {choice.size} of 512 tokens (")
