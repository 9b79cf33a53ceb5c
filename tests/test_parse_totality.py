"""Every parser is total: malformed input never raises (deterministic random garbage + samples mangled)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from console.parsers.journal import parse_journal_json
from console.parsers.metrics import parse_vllm_metrics
from console.telemetry.spec_window import spec_decode_window
from console.parsers.nvidia_smi import classify_gpu_error, parse_gpu_csv
from console.parsers.systemd import parse_systemctl_show
from console.parsers.tmux import parse_list_panes, tmux_status
from console.parsers.vllm_load import LoadTracker
from console.parsers.vllm_log import parse_line, split_cr

SAMPLES = Path(__file__).parent / "samples"
ALPHABET = "abcXYZ019 :,.%|/[]()<>{}=\"'\\\r\n\t-_?█▄▀\x00\x1b\ufffd"


def garbage(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 120)))


def mangled_sample_lines(rng: random.Random) -> list[str]:
    """Real lines cut at random points and with bytes flipped: the likeliest real-world malformation."""
    out = []
    for path in sorted(SAMPLES.rglob("*")):
        if not path.is_file():
            continue
        for line in path.read_bytes().decode("utf-8", errors="replace").split("\n"):
            if not line:
                continue
            cut = line[: rng.randint(0, len(line))]
            chars = list(line)
            for _ in range(3):
                chars[rng.randrange(len(chars))] = rng.choice(ALPHABET)
            out += [cut, "".join(chars)]
    return out


CALLS = [
    ("parse_line", parse_line),
    ("split_cr", split_cr),
    ("parse_gpu_csv", parse_gpu_csv),
    ("classify_gpu_error", lambda t: classify_gpu_error(1, t, t)),
    ("parse_vllm_metrics", parse_vllm_metrics),
    ("parse_systemctl_show", lambda t: parse_systemctl_show(t, "u")),
    ("parse_journal_json", parse_journal_json),
    ("parse_list_panes", parse_list_panes),
    ("tmux_status", lambda t: tmux_status("s", 0, t, t)),
]


@pytest.mark.parametrize("name,fn", CALLS, ids=[c[0] for c in CALLS])
def test_total_on_garbage(name, fn):
    rng = random.Random(1234)
    inputs = [garbage(rng) for _ in range(300)] + mangled_sample_lines(rng)
    for text in inputs:
        fn(text)  # must not raise


def test_tracker_total_on_garbage_and_mangled_logs():
    rng = random.Random(99)
    tracker = LoadTracker()
    for text in [garbage(rng) for _ in range(300)] + mangled_sample_lines(rng):
        tracker.feed(text, rng.random() * 1e9)
        assert tracker.phase in ("unknown", "stopped", "starting", "loading_weights", "compiling",
                                 "allocating_kv_cache", "capturing_cuda_graphs", "starting_api", "ready", "failed")


def test_wrong_types_do_not_raise():
    for value in (None, 3, b"bytes", ["list"]):
        assert parse_line(value) is None
        assert split_cr(value) == ""
        assert parse_gpu_csv(value) == []
        parse_vllm_metrics(value)
        parse_systemctl_show(value, "u")
        assert parse_list_panes(value) == []
        assert parse_journal_json(value) is None
    assert spec_decode_window(None, parse_vllm_metrics("")) is None


@pytest.mark.timeout(10)
def test_long_lines_parse_in_linear_time():
    long_inputs = ["A" * 100_000, "a." * 50_000, "(" + "a" * 100_000, "█ " * 50_000,
                   "SpecDecoding metrics: Per-position acceptance rate: " + "0.1, " * 20_000,
                   "Loading safetensors checkpoint shards: 5% Completed | " + "1" * 100_000]
    for text in long_inputs:
        parse_line(text)
        parse_gpu_csv(text)
        parse_journal_json(text)
