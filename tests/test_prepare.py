"""The prepare stage (`python -m backend.prepare`) for real: speculators' own prepare-data writes the
datasets, the tiny verifier is the verifier, and the stand-in's render endpoint tokenizes turns when the
generation run has no exact token ids. Kept and dropped rows are counted exactly, per reason."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.generate.records import token_row
from backend.prepare import rows as R
from harness.drafter_support import Tokenizer, run_stage, sample_record, stage_env, tiny_verifier, write_generate_run
from harness.sim_support import SimServer

pytestmark = pytest.mark.timeout(240)

SEQ = 1024  # the canned demo records fit (up to ~550 tokens with the tiny verifier's 512-token BPE)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_verifier(tmp_path_factory)


@pytest.fixture(scope="module")
def tok(tiny) -> Tokenizer:
    return Tokenizer(tiny)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return stage_env(tmp_path_factory)


def bad_token_lines(tok: Tokenizer, first: dict) -> tuple[list[bytes], dict[str, int]]:
    """Token rows a generation run should never hold, one per reason, and a long row that is only clipped."""
    prompt = tok.chat([{"role": "user", "content": "hello"}], generation_prompt=True)
    answer = tok.encode("word " * SEQ)  # > SEQ tokens after the prompt: kept, clipped to SEQ
    long_prompt = tok.encode("question " * 300)
    rows = [
        {"id": "long", "input_ids": prompt + answer, "loss_mask": [0] * len(prompt) + [1] * len(answer)},
        {"id": "vocab", "input_ids": [*prompt, 5000], "loss_mask": [0] * len(prompt) + [1]},
        {"id": "nothing", "input_ids": prompt, "loss_mask": [0] * len(prompt)},
        {"id": "fills", "input_ids": long_prompt + [7, 8], "loss_mask": [0] * len(long_prompt) + [1, 1]},
        {"id": first["id"], "input_ids": [1, 2], "loss_mask": [0, 1]},
        {"id": "skew", "input_ids": [1, 2, 3], "loss_mask": [0, 1]},
    ]
    lines = [json.dumps(r).encode() + b"\n" for r in rows] + [b"{not json\n", b'{"id": "torn", "input_ids": [1, 2']
    dropped = {R.OUT_OF_VOCAB: 1, R.UNSUPERVISED: 1, R.PROMPT_FILLS: 1, R.DUPLICATE: 1, R.MALFORMED: 1,
               R.UNREADABLE: 2}
    return lines, dropped


def load_rows(path: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    from datasets import load_from_disk

    data = load_from_disk(path).with_format(None)
    assert data.column_names == ["input_ids", "loss_mask", "seq_len"]
    return sorted((tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in data)


def test_token_rows_are_judged_exactly_and_split_by_sample_id(tiny, tok, env, tmp_path):
    records = [sample_record(tok, i) for i in range(30)]
    extra, dropped = bad_token_lines(tok, records[0])
    write_generate_run(tmp_path, "gen", records, extra_token_lines=extra)
    res = run_stage("backend.prepare", "--work-dir", str(tmp_path), "--run-id", "prep", "--input-run", "gen",
                    "--verifier", str(tiny), "--seq-length", str(SEQ), "--heldout-fraction", "0.1", env=env)
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "prep"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["source"] == "token_rows"
    rows = summary["rows"]
    assert rows["read"] == 30 + len(extra) and rows["kept"] == 31 and rows["clipped"] == 1
    assert rows["dropped_by_reason"] == dict(sorted(dropped.items())) and rows["dropped"] == 7
    assert (rows["train"], rows["heldout"]) == (27, 4)  # ceil(10% of 31) = 4 held out
    # what was kept is what the datasets hold: every kept row, clipped to the window, on one side only
    kept = [r for r in (json.loads(l) for l in (tmp_path / "runs/gen/prepare/tokens.jsonl").read_text().splitlines()
                        if l.startswith("{") and l.endswith("}"))
            if r["id"] in {rec["id"] for rec in records} | {"long"} and len(r["input_ids"]) > 2]
    expected = sorted((tuple(r["input_ids"][:SEQ]), tuple(r["loss_mask"][:SEQ])) for r in kept)
    train, held = load_rows(summary["outputs"]["train_data"]), load_rows(summary["outputs"]["heldout_data"])
    assert sorted(train + held) == expected and not set(train) & set(held)
    tokens = sum(len(ids) for ids, _ in expected)
    supervised = sum(sum(mask) for _, mask in expected)
    assert summary["tokens"]["total"] == tokens and summary["tokens"]["supervised"] == supervised
    assert summary["tokens"]["train"] + summary["tokens"]["heldout"] == tokens
    assert summary["supervised_share"] == round(supervised / tokens, 4)
    # the held-out slice is the one chosen by sample id, and the split is recorded
    split = json.loads((run / "split.json").read_text())
    assert set(split["heldout_ids"]) == R.choose_heldout([r["id"] for r in kept], 4, 0)
    held_ids = {r["id"] for r in kept if r["id"] in split["heldout_ids"]}
    assert sorted((tuple(r["input_ids"][:SEQ]), tuple(r["loss_mask"][:SEQ])) for r in kept if r["id"] in held_ids) == held
    # every dropped row is named with its reason; token frequencies of the training side are saved
    named = [json.loads(l) for l in (run / "dropped.jsonl").read_text().splitlines()]
    assert sorted(d["id"] for d in named if d["id"]) == sorted(["vocab", "nothing", "fills", records[0]["id"], "skew"])
    import torch
    freq = torch.load(summary["outputs"]["token_freq"])
    assert sum(int(v) for v in (freq.values() if isinstance(freq, dict) else freq.tolist())) > 0
    assert not (run / "rows").exists()  # intermediate row files are gone
    # the stage says it on stdout too
    assert f"31 kept (27 train, 4 held out), 7 dropped, 1 clipped to {SEQ} tokens" in res.stdout
    assert "dropped 1: token id outside the verifier's vocabulary" in res.stdout
    assert f"{100 * supervised / tokens:.1f}%" in res.stdout
    events = [json.loads(l) for l in (run / "events.jsonl").read_text().splitlines()]
    assert events[0]["kind"] == "start" and events[-1]["kind"] == "finish" and events[-1]["status"] == "completed"


@pytest.fixture(scope="module")
def renderer(tiny, tmp_path_factory, env):
    server = SimServer(tmp_path_factory.mktemp("render"), "--served-model-name", "tiny", "--text-backend", "tinylm",
                       "--stats-interval", "60", env=env).start()
    try:
        server.wait_ready(timeout=90)
        yield server
    finally:
        server.terminate()
        server.kill()


def test_turns_rendered_by_the_servers_template_give_the_exact_token_rows(tiny, tok, env, renderer, tmp_path):
    records = [sample_record(tok, i) for i in range(12)]
    no_answer = {**records[0], "id": "no-answer", "conversations": records[0]["conversations"][:-1]}
    bad = [json.dumps(no_answer).encode() + b"\n", b"not json\n"]
    write_generate_run(tmp_path, "gen-text", records, token_rows=False, extra_record_lines=bad)
    res = run_stage("backend.prepare", "--work-dir", str(tmp_path), "--verifier", str(tiny), "--seq-length",
                    str(SEQ), "--heldout-fraction", "0.2", "--run-id", "p-text", "--input-run", "gen-text",
                    "--render-endpoint", renderer.url, env=env)
    assert res.returncode == 0, res.stderr
    text = json.loads((tmp_path / "runs/p-text/summary.json").read_text())
    assert text["source"] == "records"
    assert text["rows"]["kept"] == 12 and text["rows"]["dropped_by_reason"] == {R.NO_ANSWER: 1, R.UNREADABLE: 1}
    assert (text["rows"]["train"], text["rows"]["heldout"]) == (8, 4)  # at least --heldout-min 4
    # the render endpoint reproduces, token for token and mask for mask, the ids the server returned
    exact = sorted((tuple(r["input_ids"]), tuple(r["loss_mask"])) for r in map(token_row, records))
    assert sorted(load_rows(text["outputs"]["train_data"]) + load_rows(text["outputs"]["heldout_data"])) == exact


def test_a_render_endpoint_that_is_down_fails_the_run_at_once(tiny, tok, env, tmp_path):
    from harness.sim_support import free_port

    write_generate_run(tmp_path, "gen", [sample_record(tok, i) for i in range(3)], token_rows=False)
    res = run_stage("backend.prepare", "--work-dir", str(tmp_path), "--run-id", "p", "--input-run", "gen",
                    "--verifier", str(tiny), "--render-endpoint", f"http://127.0.0.1:{free_port()}", env=env)
    assert res.returncode == 1
    summary = json.loads((tmp_path / "runs/p/summary.json").read_text())
    assert summary["status"] == "failed" and "does not answer" in summary["error"]
    assert "prepare: failed: the render endpoint" in res.stderr


@pytest.mark.parametrize("case", ["running", "failed", "no-verifier", "no-render-endpoint", "other-stage"])
def test_bad_input_is_one_clear_line_and_nothing_is_created(case, tiny, tok, env, tmp_path):
    records = [sample_record(tok, i) for i in range(3)]
    status = {"running": None, "failed": "failed"}.get(case, "completed")
    write_generate_run(tmp_path, "gen", records, status=status, token_rows=case != "no-render-endpoint")
    verifier = str(tmp_path / "not-here") if case == "no-verifier" else str(tiny)
    input_run = "gen"
    if case == "other-stage":
        run_stage("backend.prepare", "--work-dir", str(tmp_path), "--run-id", "p0", "--input-run", "gen",
                  "--verifier", "/nowhere", env=env)
        (tmp_path / "runs/p0").mkdir(exist_ok=True)
        (tmp_path / "runs/p0/manifest.json").write_text(json.dumps({"stage": "extract", "run_id": "p0",
                                                                     "identity": {}}))
        input_run = "p0"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    res = run_stage("backend.prepare", "--work-dir", str(tmp_path), "--run-id", "p", "--input-run", input_run,
                    "--verifier", verifier, env=env)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prepare: ")
    expected = {"running": "generate run gen has not finished (still running, or it died without a word)",
                "failed": "generate run gen failed: 3 samples failed after retries; resume it with --run-id gen",
                "no-verifier": f"verifier {tmp_path}/not-here does not exist on this host",
                "no-render-endpoint": "pass --render-endpoint URL",
                "other-stage": "run 'p0' is not a generate run (extract)"}[case]
    assert expected in lines[0]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing created or changed


def test_a_run_dir_holding_another_prepare_is_refused_and_kept(tiny, tok, env, tmp_path):
    from backend.contract.runs import Manifest, open_run_dir

    write_generate_run(tmp_path, "gen", [sample_record(tok, i) for i in range(6)])
    old = open_run_dir(str(tmp_path), "p", Manifest(stage="prepare", run_id="p", identity={"seq_length": 128}))
    Path(old.file("train")).mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    res = run_stage("backend.prepare", "--work-dir", str(tmp_path), "--run-id", "p", "--input-run", "gen",
                    "--verifier", str(tiny), "--seq-length", "512", env=env)
    assert res.returncode == 2 and "seq_length was 128, now 512" in res.stderr and "--fresh" in res.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_heldout_count_and_choice_are_deterministic_and_order_free():
    assert [R.heldout_count(n, 0.05, 4) for n in (0, 1, 2, 5, 8, 100, 1000)] == [0, 0, 1, 2, 4, 5, 50]
    assert R.heldout_count(100, 0.0, 4) == 0
    ids = [f"s{i}" for i in range(50)]
    picked = R.choose_heldout(ids, 5, seed=0)
    assert len(picked) == 5 and R.choose_heldout(list(reversed(ids)), 5, seed=0) == picked
    assert R.choose_heldout(ids, 5, seed=1) != picked
    # a longer run holds out a superset-stable slice: the same ids keep their ranks
    assert R.choose_heldout(ids + [f"t{i}" for i in range(10)], 60, 0) >= picked


def test_check_row_reasons():
    ok = {"id": "a", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}
    assert R.check_row(ok, vocab_size=10, seq_length=16, minimum_valid_tokens=None) is None
    assert R.check_row(ok, vocab_size=10, seq_length=16, minimum_valid_tokens=3) == R.TOO_FEW
    assert R.check_row(ok, vocab_size=10, seq_length=1, minimum_valid_tokens=None) == R.PROMPT_FILLS
    assert R.check_row({**ok, "loss_mask": [0, 1, 2]}, vocab_size=10, seq_length=16,
                       minimum_valid_tokens=None) == R.MALFORMED
    assert R.check_row({**ok, "id": 3}, vocab_size=10, seq_length=16, minimum_valid_tokens=None) == R.MALFORMED
    assert R.check_row({**ok, "input_ids": [1, 2, -1]}, vocab_size=10, seq_length=16,
                       minimum_valid_tokens=None) == R.OUT_OF_VOCAB
    assert R.clipped({"input_ids": [1] * 10, "loss_mask": [0] * 4 + [1] * 6}, 8) == (8, 4, True)
