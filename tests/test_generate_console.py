"""The console's side of prompts that do not fit: the profile choice, the stage's argv, the generation pane."""
from __future__ import annotations

import pytest

from backend.generate.config import parse_config
from console.control.stage_argv import generate_argv
from console.profile import ProfileError, profile_from_dict
from console.snapshot import RunInfo
from console.telemetry.progress import generation_view, reason_counts
from console.ui.panes.generation import by_reason, generation_markup, outcome_lines

BASE = {"host": {"name": "localhost", "transport": "local"},
        "server": {"model_path": "/m", "manager": "tmux", "unit": "u"},
        "paths": {"work_dir": "/w"}, "generate": {"dataset": "/d.jsonl"}}


def _profile(**generate):
    return profile_from_dict({**BASE, "generate": {**BASE["generate"], **generate}}, file="p.toml")


@pytest.mark.parametrize("choice", ["reduce", "skip"])
def test_long_prompt_choice_reaches_the_stage(choice):
    argv = generate_argv(_profile(long_prompt=choice), "r1")
    assert argv[argv.index("--long-prompt") + 1] == choice
    # what the console builds, the stage accepts
    assert parse_config(argv[argv.index("--dataset"):]).long_prompt == choice


def test_long_prompt_defaults_to_reduce_and_refuses_other_values():
    assert _profile().generate.long_prompt == "reduce"
    with pytest.raises(ProfileError) as info:
        _profile(long_prompt="shrink")
    assert "p.toml: generate.long_prompt: expected one of 'reduce', 'skip', got 'shrink'" in str(info.value)


def _run(event: dict) -> RunInfo:
    base = {"kind": "progress", "done": 27, "total": 30, "failed": 0, "skipped": 0, "rate": 1.0}
    return RunInfo("generate", "gen-1", "done", "e3-generate-gen-1", 27, 30, 0, 1.0, None, {**base, **event})


def test_generation_pane_shows_counts_by_reason():
    content = generation_markup(_run({"skipped": 3, "skipped_by_reason": {"invalid_json": 1, "prompt_too_long": 2},
                                      "reduced": 4, "failed": 2, "failed_permanent": 1,
                                      "failed_by_reason": {"server_error": 1, "rejected": 1}}), None)
    text = content.plain
    assert "skipped  3: prompt_too_long 2 · invalid_json 1   reduced max_tokens 4" in text
    assert "failed   2: rejected 1 · server_error 1" in text
    assert "a rerun retries them" in text and "1 rejected: a rerun cannot help" in text
    # nothing skipped or failed: no extra lines
    assert outcome_lines(generation_view(_run({"skipped": 0, "failed": 0}))) == []


def test_reasons_from_the_host_are_plain_text():
    counts = reason_counts({"b": 2, "c": 3, "d": 4, "e": 5, "ok": "many", "a": 1, "nan": float("nan")})
    assert by_reason(counts, limit=4) == "e 5 · d 4 · c 3 · b 2 · +1 more"
    (line,) = outcome_lines(generation_view(_run({"skipped": 1, "skipped_by_reason": {"[@click=app.quit]x[/]\x1b]52;": 1}})))
    # as text: no action; the escape sequence is cut out whole (console/parsers/text.clean)
    assert line.plain == "skipped  1: [@click=app.quit]x[/] 1"
    assert not [span for span in line.spans if "click" in str(span.style)]
