"""The one-command probe: script shape, quoting, and cutting the answer into sections."""
from __future__ import annotations

import asyncio
import json
import shlex

from console.profile import profile_from_dict
from console.host.local import LocalHost
from console.telemetry.probe import EventsRead, build_probe, parse_df, parse_runs_listing, split_sections


def profile(tmp_path, **server):
    return profile_from_dict({
        "host": {"name": "gpu-host.example"},
        "server": {"model_path": "/m", "unit": "vllm-x", **server},
        "paths": {"work_dir": str(tmp_path)},
        "gpus": {"command": ["sh", "-c", "echo '0, NVIDIA H200, 1, 143771, 0, 30, 70.5'"]},
    })


def test_probe_runs_as_one_command_and_splits(tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "events.jsonl").write_bytes(b'{"kind":"start"}\n{"kind":"progress","done":1}\npartial')
    p = profile(tmp_path, manager="tmux")
    argv, plan = build_probe(p, events=[EventsRead(str(run), 17, 1 << 20)], server_log=(str(tmp_path / "nolog"), 0))
    assert argv[:2] == ["sh", "-c"]
    res = asyncio.run(LocalHost().run(argv))
    sec = split_sections(res.stdout, plan)
    assert set(sec) == {"service", "gpus", "runs", "disk", "events:0", "server_log"}
    assert sec["gpus"].rc == 0 and "NVIDIA H200" in sec["gpus"].text
    assert sec["service"].rc != 0  # no such tmux session
    assert sec["events:0"].text == '{"kind":"progress","done":1}\npartial'
    assert sec["server_log"].text == "0 0\n"  # `INODE SIZE` first: no such file yet
    runs = parse_runs_listing(sec["runs"].text)
    assert [r.run_id for r in runs] == ["r1"] and runs[0].size == 53
    assert parse_df(sec["disk"].text) > 0


def test_probe_quotes_profile_values(tmp_path):
    p = profile(tmp_path)
    argv, plan = build_probe(p, stage_units=["e3-generate-a"])
    script = argv[2]
    assert shlex.join(["systemctl", "show", "vllm-x", "-p"]) in script
    assert "e3-generate-a" in script


def test_split_sections_tolerates_truncation():
    marker = "@@M"
    from console.telemetry.probe import ProbePlan
    plan = ProbePlan(marker=marker, sections=["a", "b"])
    out = f"{marker} a\nx\ny\n{marker} rc=0\n{marker} b\npartial"
    sec = split_sections(out, plan)
    assert sec["a"].text == "x\ny" and sec["a"].rc == 0
    assert sec["b"].text == "partial" and sec["b"].rc is None
    assert split_sections("garbage\n", plan) == {}


def test_events_bytes_survive_exactly(tmp_path):
    run = tmp_path / "runs" / "r2"
    run.mkdir(parents=True)
    lines = [json.dumps({"kind": "progress", "done": i, "note": "ünïcode"}) for i in range(50)]
    (run / "events.jsonl").write_text("\n".join(lines) + "\n")
    argv, plan = build_probe(profile(tmp_path), events=[EventsRead(str(run), 0, 1 << 20)])
    res = asyncio.run(LocalHost().run(argv))
    assert split_sections(res.stdout, plan)["events:0"].text == "\n".join(lines) + "\n"


def test_undecodable_bytes_keep_their_offsets(tmp_path):
    """A byte that is not UTF-8 comes back as itself, so a reader counting bytes never drifts into the
    middle of the next line (decoding with replacement and re-encoding made one byte three)."""
    p = profile(tmp_path, manager="tmux")
    log = tmp_path / "server.log"
    data = b"ok \xff\xfe line\nsecond \xc3 line\n"
    log.write_bytes(data)
    argv, plan = build_probe(p, server_log=(str(log), 0))
    res = asyncio.run(LocalHost().run(argv, errors="surrogateescape"))
    head, _, body = split_sections(res.stdout, plan)["server_log"].data.partition(b"\n")
    assert body == data
    assert head.split()[1] == str(len(data)).encode()
