"""Generation from several sources, each a count or a share, sampled with a seed (backend/generate/sources.py):
exact per-source counts, the same rows on a resume or a second run, and the selection in the manifest."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from backend.contract.runs import Manifest, ManifestMismatch, open_run_dir
from backend.generate import sources as src
from harness.generate_support import REPO, events, gen_argv, records, run_gen


def _dataset(path: Path, n: int, tag: str) -> str:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{tag} question {i}"}]}) + "\n")
    return str(path)


def _sources(tmp_path: Path) -> list[dict]:
    return [{"name": "chat", "dataset": _dataset(tmp_path / "chat.jsonl", 40, "chat"), "count": 7},
            {"name": "code", "dataset": _dataset(tmp_path / "code.jsonl", 30, "code"), "share": 0.6},
            {"name": "math", "dataset": _dataset(tmp_path / "math.jsonl", 25, "math"), "share": 0.4}]


def test_counts_and_shares_add_up_exactly():
    specs = src.parse([{"name": "a", "dataset": "/a", "count": 5}, {"name": "b", "dataset": "/b", "share": 1 / 3},
                       {"name": "c", "dataset": "/c", "share": 1 / 3}, {"name": "d", "dataset": "/d", "share": 1 / 3}])
    assert src.counts_for(specs, 15) == [5, 4, 3, 3]  # 10 left, 3.33 each: the largest remainder (a tie: by name)
    assert sum(src.counts_for(specs, 1000)) == 1000
    with pytest.raises(src.SourceError, match="needs --sample-total"):
        src.counts_for(specs, None)
    with pytest.raises(src.SourceError, match="below the sources' counts"):
        src.counts_for(specs, 3)
    for bad, why in (([{"name": "a", "dataset": "/a"}], "exactly one of count and share"),
                     ([{"name": "a b", "dataset": "/a", "count": 1}], "name must be"),
                     ([{"name": "a", "dataset": "/a", "share": 0.7}, {"name": "b", "dataset": "/b", "share": 0.7}],
                      "add up to 1.4"),
                     ([{"name": "a", "dataset": "/a", "count": 1, "weight": 2}], "unknown key"),
                     ([{"name": "a", "dataset": "/a", "count": 1}, {"name": "a", "dataset": "/b", "count": 1}],
                      "used twice")):
        with pytest.raises(src.SourceError, match=why):
            src.parse(bad)


def test_the_seeded_selection_is_stable_exact_and_recorded(tmp_path):
    spec = _sources(tmp_path)
    first, again = src.plan(spec, 20, seed=7), src.plan(spec, 20, seed=7)
    assert first.counts() == {"chat": 7, "code": 8, "math": 5}
    assert [s.positions for s in first.sources] == [s.positions for s in again.sources]
    assert first.identity() == again.identity()
    other = src.plan(spec, 20, seed=8)
    assert [s.positions for s in other.sources] != [s.positions for s in first.sources]
    samples = list(first.iter_samples())
    assert [s.index for s in samples] == list(range(20))
    by = {}
    for s in samples:
        by.setdefault(src.source_of(s.sample_id), []).append(s.prompt[0]["content"])
    assert {k: len(v) for k, v in by.items()} == {"chat": 7, "code": 8, "math": 5}
    chosen = {s.spec.name: s.positions for s in first.sources}
    assert by["code"] == [f"code question {i}" for i in chosen["code"]]
    assert src.done_by_source([s.sample_id for s in samples[:9]], first) == {"chat": 7, "code": 2, "math": 0}
    # the manifest carries the selection: the same settings resume, another seed is refused
    ident = {"x": 1, **first.identity()}
    open_run_dir(str(tmp_path / "w"), "r", Manifest(stage="generate", run_id="r", identity=ident))
    open_run_dir(str(tmp_path / "w"), "r", Manifest(stage="generate", run_id="r", identity={"x": 1, **again.identity()}))
    with pytest.raises(ManifestMismatch):
        open_run_dir(str(tmp_path / "w"), "r", Manifest(stage="generate", run_id="r",
                                                         identity={"x": 1, **other.identity()}))
    with pytest.raises(src.SourceError, match="26 rows asked for"):
        src.plan([{"name": "m", "dataset": spec[2]["dataset"], "count": 26}], None, 0)


def test_a_sourced_run_killed_and_resumed_keeps_its_rows_and_counts(standin, tmp_path):  # noqa: F811
    server = standin("--latency", "0.05")
    spec = _sources(tmp_path)
    argv = gen_argv(server, tmp_path / "unused", tmp_path / "w", "--concurrency", "2", "--flush-every", "2")
    at = argv.index("--dataset")
    argv[at:at + 2] = ["--sources", json.dumps(spec), "--sample-total", "20", "--selection-seed", "7"]
    run = tmp_path / "w" / "runs" / "r"
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if (run / "output.jsonl").exists() and (run / "output.jsonl").read_bytes().count(b"\n") >= 4:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    result = run_gen(argv)
    assert result.returncode == 0, result.stderr
    recs = records(run)
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)) == 20
    chosen = src.plan(spec, 20, seed=7)
    want = {s.sample_id for s in chosen.iter_samples()}
    assert set(ids) == want  # exactly the seeded rows, none twice, across the kill
    finish = [e for e in events(run) if e["kind"] == "finish"][-1]
    assert finish["summary"]["by_source"] == {"done": {"chat": 7, "code": 8, "math": 5},
                                              "selected": {"chat": 7, "code": 8, "math": 5}}
    manifest = json.loads((run / "manifest.json").read_text())
    assert [s["count"] for s in manifest["identity"]["sources"]] == [7, 8, 5]
    assert manifest["identity"]["selection_seed"] == 7


def test_the_generation_pane_shows_per_source_counts():
    from console.snapshot import RunInfo
    from console.telemetry.progress import generation_view
    from console.ui.panes.generation import source_line

    def view(event: dict):
        return generation_view(RunInfo(run_id="g", stage="generate", state="running", last_event=event))

    line = source_line(view({"by_source": {"done": {"chat": 7, "code": 2},
                                           "selected": {"chat": 7, "code": 8, "m[b]": 5, "bad": "x"}}}))
    assert line.plain == "sources  chat 7/7 · code 2/8 · m[b] 0/5"
    assert source_line(view({"done": 3})) is None


def test_the_profile_names_sources_and_the_stage_gets_them():
    from backend.generate.config import parse_config
    from console.control.stage_argv import generate_argv
    from console.profile import ProfileError, profile_from_dict

    base = {"host": {"name": "gpu-host.example"}, "server": {"model_path": "/m"}, "paths": {"work_dir": "/w"}}
    spec = [{"name": "chat", "dataset": "/d/chat.jsonl", "count": 600},
            {"name": "code", "dataset": "/d/code", "share": 1.0}]
    p = profile_from_dict({**base, "generate": {"sources": spec, "samples": 800, "selection_seed": 7}})
    argv = generate_argv(p, "g1")
    c = parse_config(argv[3:])
    assert (c.sources, c.sample_total, c.selection_seed, c.dataset, c.limit) == (spec, 800, 7, "", None)
    with pytest.raises(ProfileError, match="generate.sources: expected sources\\[0\\] \\(a\\): give exactly one"):
        profile_from_dict({**base, "generate": {"sources": [{"name": "a", "dataset": "/d"}]}})
    with pytest.raises(ProfileError, match="dataset must be"):
        profile_from_dict({**base, "generate": {"sources": [{"name": "a", "dataset": "/d;rm", "count": 1}]}})
