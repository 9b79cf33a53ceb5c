"""The bench stage's pure parts: acceptance from two scrapes, vllm bench serve's result JSON, our client's
figures, the comparison and its table, the workload, the command lines. All on real-format samples."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.bench import compare as cmp
from backend.bench import vllm_cli, workload
from backend.bench.config import ConfigError, parse_config
from backend.bench.results import (OUR_CLIENT, VLLM_BENCH, BenchResult, BenchResultError, LevelResult,
                                   RequestOutcome, figures, parse_vllm_bench_result, percentile)
from backend.bench.scrape import acceptance_between, parse_spec_counters
from backend.contract.lookup import InputError
from console.parsers.metrics import parse_vllm_metrics
from console.telemetry.spec_window import spec_decode_window

SAMPLES = Path(__file__).parent / "samples"


def metrics_sample(name: str) -> str:
    return (SAMPLES / "metrics" / name).read_text()


def bench_sample(name: str) -> dict:
    return json.loads((SAMPLES / "bench" / name).read_text())


# ---- acceptance from two real-format scrapes ----------------------------------------------------------
def test_acceptance_between_two_scrapes_of_two_engines():
    a = parse_spec_counters(metrics_sample("v0_33_dp2_spec_a.prom"))
    b = parse_spec_counters(metrics_sample("v0_33_dp2_spec_b.prom"))
    acc = acceptance_between(a, b)
    assert (acc.drafts, acc.draft_tokens, acc.accepted) == (1300.0, 3900.0, 1890.0)
    assert acc.rate == pytest.approx(1890 / 3900) and acc.length == pytest.approx(1 + 1890 / 1300)
    assert acc.per_position == pytest.approx((1000 / 1300, 550 / 1300, 340 / 1300))
    # the console's own parser (prometheus_client) reads the same window from the same pages
    w = spec_decode_window(parse_vllm_metrics(metrics_sample("v0_33_dp2_spec_a.prom")),
                           parse_vllm_metrics(metrics_sample("v0_33_dp2_spec_b.prom")))
    assert (w.acceptance_rate, w.mean_acceptance_length) == pytest.approx((acc.rate, acc.length))
    assert w.per_position == pytest.approx(acc.per_position)


def test_scrapes_without_drafter_restart_or_other_model():
    assert parse_spec_counters(metrics_sample("v0_11_old_kv.prom")) is None  # no drafter: no acceptance
    a = parse_spec_counters(metrics_sample("v0_33_dp2_spec_a.prom"))
    b = parse_spec_counters(metrics_sample("v0_33_dp2_spec_b.prom"))
    assert acceptance_between(b, a) is None  # counters went down: the server restarted in between
    assert acceptance_between(a, a) is None  # nothing drafted in the window
    assert parse_spec_counters(metrics_sample("v0_33_dp2_spec_a.prom"), "another-model") is None
    since_start = acceptance_between(None, a)
    assert since_start.length == pytest.approx(1 + 2000 / 1500)


def test_scrape_parser_is_total_on_junk():
    junk = ('vllm:spec_decode_num_drafts_total{engine="0"} NaN\nvllm:spec_decode_num_drafts_total{ 3\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="999999"} 5\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="x"} 5\n'
            'vllm:spec_decode_num_drafts_total 4\nvllm:spec_decode_num_draft_tokens_total -3\n')
    counters = parse_spec_counters(junk)
    assert counters.drafts == 4 and counters.draft_tokens == 0 and counters.per_pos == {}


# ---- vllm bench serve's saved result -----------------------------------------------------------------
def test_vllm_bench_result_with_spec_decode_keys():
    lv = parse_vllm_bench_result(bench_sample("vllm_bench_serve_0.15.1_eagle3.json"))
    assert (lv.concurrency, lv.completed, lv.failed, lv.source) == (16, 200, 0, VLLM_BENCH)
    assert lv.output_throughput == pytest.approx(1062.0777397151819)
    assert lv.request_throughput == pytest.approx(2.0743705853812147)
    assert lv.stat("tpot", "median") == pytest.approx(14.52021338045597)
    assert lv.stat("ttft", "p99") == pytest.approx(701.4430236816406)
    assert lv.stat("e2el", "p90") == pytest.approx(8688.170671463013)
    acc = lv.acceptance
    assert acc.rate == pytest.approx(0.6125) and acc.length == pytest.approx(2.8375)  # rate was in percent
    assert (acc.drafts, acc.draft_tokens, acc.accepted) == (36088, 108264, 66312)
    assert acc.per_position == pytest.approx((0.7811460872311016, 0.6137497229051208, 0.44259587674573265))


def test_vllm_bench_result_of_an_older_release():
    lv = parse_vllm_bench_result(bench_sample("vllm_bench_serve_0.11.0_baseline.json"))
    assert (lv.completed, lv.failed, lv.acceptance) == (199, 1, None)  # no spec keys before 0.15.1
    assert lv.stat("itl", "p99") == pytest.approx(44.5094108581543) and lv.stat("itl", "p90") is None
    assert LevelResult.from_dict(json.loads(json.dumps(lv.to_dict()))) == lv


def test_vllm_bench_result_errors_name_the_key():
    data = bench_sample("vllm_bench_serve_0.15.1_eagle3.json")
    with pytest.raises(BenchResultError, match="output_throughput: expected a finite number"):
        parse_vllm_bench_result({**data, "output_throughput": "fast"})
    with pytest.raises(BenchResultError, match="max_concurrency: expected an integer"):
        parse_vllm_bench_result({**data, "max_concurrency": None})
    with pytest.raises(BenchResultError, match="expected a JSON object"):
        parse_vllm_bench_result([data])


# ---- our client's figures, vLLM's definitions ----------------------------------------------------------
def test_figures_follow_vllm_definitions():
    np = pytest.importorskip("numpy")
    outs = [RequestOutcome(True, prompt_tokens=10, output_tokens=5, ttft=0.1, itl=[0.02, 0.03, 0.05], latency=0.2),
            RequestOutcome(True, prompt_tokens=20, output_tokens=1, ttft=0.3, itl=[], latency=0.3),
            RequestOutcome(True, prompt_tokens=30, output_tokens=9, ttft=0.2, itl=[0.1, 0.1], latency=0.4),
            RequestOutcome(False, error="HTTP 500")]
    lv = figures(outs, 2.0, 4, None)
    assert (lv.completed, lv.failed, lv.total_input_tokens, lv.total_output_tokens) == (3, 1, 60, 15)
    assert lv.request_throughput == 1.5 and lv.output_throughput == 7.5 and lv.total_token_throughput == 37.5
    tpots = [(0.2 - 0.1) / 4, (0.4 - 0.2) / 8]  # only requests with more than one token
    itls = [0.02, 0.03, 0.05, 0.1, 0.1]
    assert lv.stat("tpot", "mean") == pytest.approx(np.mean(tpots) * 1000)
    assert lv.stat("itl", "p99") == pytest.approx(np.percentile(itls, 99) * 1000)
    assert lv.stat("itl", "std") == pytest.approx(np.std(itls) * 1000)
    assert lv.stat("ttft", "median") == pytest.approx(200.0) and lv.stat("e2el", "p90") == pytest.approx(
        np.percentile([0.2, 0.3, 0.4], 90) * 1000)
    for q in (0, 12.5, 50, 90, 99, 100):
        assert percentile([3.0, 1.0, 7.0, 2.0], q) == pytest.approx(np.percentile([3.0, 1.0, 7.0, 2.0], q))
    assert figures([], 1.0, 1, None).stat("ttft", "mean") == 0.0


# ---- comparison --------------------------------------------------------------------------------------
def _result(label: str, tps: dict[int, float], length: float | None = None) -> BenchResult:
    from backend.bench.scrape import Acceptance

    acc = Acceptance(100, 300, 3 * (length - 1) * 100 / 3, (length - 1) / 3, length, ()) if length else None
    levels = tuple(LevelResult(concurrency=c, completed=8, failed=0, duration_s=1.0, total_input_tokens=80,
                               total_output_tokens=int(t), request_throughput=8.0, output_throughput=t,
                               total_token_throughput=t + 80, latency_ms={"tpot": {"median": 1000 / t}},
                               acceptance=acc) for c, t in tps.items())
    return BenchResult(label=label, model="m", endpoint="http://127.0.0.1:1", client="c", workload={}, levels=levels)


def test_compare_ratios_acceptance_and_slower():
    base = _result("baseline", {1: 100.0, 4: 300.0, 8: 500.0})
    drafter = _result("drafter", {1: 210.0, 4: 270.0}, length=2.9)
    published = _result("published", {1: 150.0, 4: 330.0}, length=2.1)
    c = cmp.compare([drafter, base, published])  # the baseline is found by its label
    assert c.baseline == "baseline" and c.labels == ("baseline", "drafter", "published")
    rows = {(r.concurrency, r.label): r for r in c.rows}
    assert rows[(1, "drafter")].ratio == pytest.approx(2.1) and not rows[(1, "drafter")].slower
    assert rows[(4, "drafter")].ratio == pytest.approx(0.9) and rows[(4, "drafter")].slower
    assert rows[(4, "published")].ratio == pytest.approx(1.1) and rows[(1, "baseline")].ratio is None
    assert rows[(1, "drafter")].acceptance_length == pytest.approx(2.9)
    assert c.slower and c.missing == ("concurrency 8: not measured by drafter, published",)
    table = cmp.format_table(c)
    assert "0.90x SLOWER" in table and "2.10x" in table and "a drafter is SLOWER" in table
    back = cmp.comparison_from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c and back.slower


def test_compare_refuses_what_it_cannot_compare():
    base = _result("baseline", {1: 100.0})
    with pytest.raises(cmp.CompareError, match="two to 12 results"):
        cmp.compare([base])
    with pytest.raises(cmp.CompareError, match="its own label"):
        cmp.compare([base, base])
    with pytest.raises(cmp.CompareError, match="no result labelled 'x'"):
        cmp.compare([base, _result("drafter", {1: 1.0})], "x")
    assert not cmp.compare([base, _result("drafter", {1: 100.0})]).slower  # equal is not slower


def test_comparison_from_untrusted_json_is_bounded():
    rows = [{"concurrency": 1, "label": "x" * 500, "output_tps": "NaN", "ratio": float("inf"), "slower": "yes",
             "failed": 0}] * 500
    c = cmp.comparison_from_dict({"baseline": "b", "rows": rows, "labels": ["b"] * 9, "missing": ["m"] * 999})
    assert len(c.rows) == cmp.MAX_ROWS and len(c.rows[0].label) == cmp.MAX_LABEL
    assert c.rows[0].ratio is None and c.rows[0].output_tps == 0.0 and not c.rows[0].slower
    with pytest.raises(cmp.CompareError):
        cmp.comparison_from_dict({"rows": [{"concurrency": -1, "label": "a", "failed": 0}], "baseline": "b"})


# ---- the command line and the workload ---------------------------------------------------------------
BASE_ARGS = ["--work-dir", "/w", "--run-id", "b1", "--endpoint", "http://127.0.0.1:8000", "--model", "m",
             "--prompts", "/p.jsonl"]


@pytest.mark.parametrize("extra, why", [
    (["--label", "drafter;rm"], "--label"),
    (["--concurrency", "1,x"], "comma-separated integers"),
    (["--concurrency", "4,4"], "distinct levels"),
    (["--max-tokens", "0"], "--max-tokens 0"),
    (["--top-p", "0"], "--top-p"),
    (["--third-run", "x"], "--third-run needs --baseline-run"),
    (["--vllm-python", "/venv/bin/python;rm"], "--vllm-python"),
])
def test_config_refusals(extra, why):
    with pytest.raises(ConfigError, match=why.replace("-", r"\-").replace(".", r"\.")):
        parse_config(BASE_ARGS + extra)


def test_config_defaults():
    c = parse_config(BASE_ARGS + ["--concurrency", "8,1,4"])
    assert (c.levels, c.label, c.temperature, c.client, c.seed) == ((1, 4, 8), "baseline", 0.0, "auto", 0)


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_workload_from_a_file_is_deterministic(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i}"}]}
            for i in range(20)] + [{"conversations": [{"from": "human", "value": "share"}, {"from": "gpt", "value": "a"}]},
                                   {"messages": []}]
    path = _write(tmp_path / "p.jsonl", rows)
    a, b = workload.from_file(str(path), 5, seed=3), workload.from_file(str(path), 5, seed=3)
    assert a == b and a.digest == b.digest and len(a.prompts) == 5 and not a.heldout
    assert workload.from_file(str(path), 5, seed=4).digest != a.digest
    every = workload.from_file(str(path), 100, seed=3)
    assert len(every.prompts) == 21  # the empty row is no prompt
    assert ({"role": "user", "content": "share"},) in [p.messages for p in every.prompts]
    with pytest.raises(InputError, match="no such file"):
        workload.from_file(str(tmp_path / "nope.jsonl"), 5, 0)


def _completed(work: Path, stage: str, run_id: str, outputs: dict, **summary):
    from backend.contract.events import EventLog
    from backend.contract.runs import Manifest, open_run_dir

    run_dir = open_run_dir(str(work), run_id, Manifest(stage=stage, run_id=run_id, identity={"r": run_id}))
    body = {"stage": stage, "run_id": run_id, "status": "completed", "outputs": outputs, **summary}
    run_dir.write_summary(body)
    log = EventLog(run_dir.events_path, stage, run_id)
    log.emit("start", total=1)
    log.emit("finish", status="completed", summary=body)
    log.close()
    return Path(run_dir.path)


def test_workload_from_a_prepare_run_takes_only_the_held_out_rows(tmp_path):
    records = [{"id": f"s{i}", "conversations": [{"role": "user", "content": f"question {i}"},
                                                 {"role": "assistant", "content": "answer", "reasoning_content": None}]}
               for i in range(10)]
    out = _write(tmp_path / "records.jsonl", records)
    _completed(tmp_path, "generate", "gen-1", {"records": str(out)})
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"heldout_ids": ["s3", "s7"]}))
    _completed(tmp_path, "prepare", "prep-1", {"split": str(split)}, input_run="gen-1")
    w = workload.from_run(str(tmp_path), "prep-1", 10, 0)
    assert w.heldout and sorted(p.sample_id for p in w.prompts) == ["s3", "s7"]
    assert w.prompts[0].messages[0]["content"].startswith("question ")
    assert "held-out rows of gen-1" in w.source
    everything = workload.from_run(str(tmp_path), "gen-1", 4, 0)
    assert not everything.heldout and len(everything.prompts) == 4
    split.write_text(json.dumps({"heldout_ids": []}))
    with pytest.raises(InputError, match="held out no rows"):
        workload.from_run(str(tmp_path), "prep-1", 10, 0)
    _completed(tmp_path, "train", "train-1", {})
    with pytest.raises(InputError, match="is a train run"):
        workload.from_run(str(tmp_path), "train-1", 10, 0)


def test_vllm_bench_serve_argv():
    prompts = (workload.Prompt("a", ({"role": "system", "content": "s"}, {"role": "user", "content": "q"})),)
    argv = vllm_cli.bench_serve_argv(["/usr/bin/vllm"], endpoint="http://127.0.0.1:8000", model="kimi",
                                     tokenizer="/shared/kimi", dataset="/r/p.jsonl", num_prompts=32, concurrency=4,
                                     max_tokens=256, temperature=0.0, top_p=None, seed=0, result_dir="/r",
                                     result_file="c4.json", label="drafter", trust_remote_code=True)
    assert argv == ["/usr/bin/vllm", "bench", "serve", "--backend", "openai-chat", "--endpoint",
                    "/v1/chat/completions", "--base-url", "http://127.0.0.1:8000", "--model", "/shared/kimi",
                    "--served-model-name", "kimi", "--tokenizer", "/shared/kimi", "--dataset-name", "custom",
                    "--dataset-path", "/r/p.jsonl", "--custom-output-len", "256", "--skip-chat-template",
                    "--disable-shuffle", "--num-prompts", "32", "--max-concurrency", "4", "--request-rate", "inf",
                    "--temperature", "0", "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
                    "--metric-percentiles", "50,90,99", "--num-warmups", "0", "--disable-tqdm", "--save-result",
                    "--result-dir", "/r", "--result-filename", "c4.json", "--label", "drafter",
                    "--trust-remote-code"]
    assert prompts[0].messages[-1]["content"] == "q"


def test_vllm_bench_serve_through_the_served_vllms_python():
    """The CPU build's `vllm` script does not run (tests/test_engine_conformance.py runs this prefix for real)."""
    argv = vllm_cli.bench_serve_argv(["/venv/bin/python", "-c", vllm_cli.CLI_MAIN], endpoint="http://127.0.0.1:8000",
                                     model="m", tokenizer=None, dataset="/r/p.jsonl", num_prompts=1, concurrency=1,
                                     max_tokens=8, temperature=0.0, top_p=None, seed=0, result_dir="/r",
                                     result_file="c1.json", label="baseline")
    assert argv[:5] == ["/venv/bin/python", "-c", vllm_cli.CLI_MAIN, "bench", "serve"]
    assert vllm_cli.shown(argv)[:4] == ["/venv/bin/python", "-c", "<vllm's CLI main>", "bench"]


def test_find_vllm_falls_back_to_path_when_the_python_has_no_vllm(tmp_path, monkeypatch):
    import sys

    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert vllm_cli.find_vllm(sys.executable) == [str(script)]  # the test venv has no vllm
    assert vllm_cli.find_vllm(str(tmp_path / "no-python")) == [str(script)]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert vllm_cli.find_vllm(sys.executable) is None and vllm_cli.find_vllm() is None


def test_the_served_python_counts_only_when_it_has_what_the_cli_needs(tmp_path, monkeypatch):
    """The probe asks the interpreter for vllm and pandas (the custom dataset's reader); one that says no is
    passed over for `vllm` on PATH. Stand-in interpreters: the real one is the engine tier's."""
    yes, no = tmp_path / "yes-python", tmp_path / "no-python"
    yes.write_text("#!/bin/sh\ncase \"$2\" in *vllm*pandas*) exit 0;; esac\nexit 3\n")
    no.write_text("#!/bin/sh\nexit 1\n")
    for f in (yes, no):
        f.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert vllm_cli.find_vllm(str(yes)) == [str(yes), "-c", vllm_cli.CLI_MAIN]
    assert vllm_cli.find_vllm(str(no)) is None


def test_client_vllm_without_a_cli_is_refused_naming_the_python(tmp_path, monkeypatch):
    import sys

    from backend.bench.runner import choose_client
    from backend.contract.runs import RunDirError

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RunDirError, match="cannot import vllm and `vllm` is not on this host's PATH"):
        choose_client(parse_config(BASE_ARGS + ["--client", "vllm", "--vllm-python", sys.executable]))
    assert choose_client(parse_config(BASE_ARGS + ["--vllm-python", sys.executable])) == (OUR_CLIENT, None)


def test_output_length_defaults_to_the_workloads_median_completion(tmp_path):
    """No fixed short cut: without --max-tokens the bench decodes as long as the generation run's answers."""
    import json as _json

    from backend.bench import workload as wl
    from backend.bench.runner import with_output_length
    from backend.contract.runs import RunDirError

    path = tmp_path / "records.jsonl"
    rows = [{"id": f"s{i}", "conversations": [{"role": "user", "content": f"q{i}"},
                                              {"role": "assistant", "content": "a"}], "completion_tokens": n}
            for i, n in enumerate([100, 8000, 6000, 7000, 9000])]
    path.write_text("".join(_json.dumps(r) + "\n" for r in rows))
    w = wl.from_file(str(path), 5, 0)
    assert w.median_completion == 7000 and w.describe()["median_completion_tokens"] == 7000
    c = parse_config(["--work-dir", "/w", "--run-id", "b1", "--endpoint", "http://127.0.0.1:8000", "--model", "m",
                      "--prompts", str(path)])
    assert c.max_tokens is None and with_output_length(c, w).max_tokens == 7000
    given = parse_config(["--work-dir", "/w", "--run-id", "b1", "--endpoint", "http://127.0.0.1:8000", "--model",
                          "m", "--prompts", str(path), "--max-tokens", "64"])
    assert with_output_length(given, w).max_tokens == 64
    bare = tmp_path / "chat.jsonl"
    bare.write_text(_json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n")
    with pytest.raises(RunDirError, match="carry no completion lengths"):
        with_output_length(c, wl.from_file(str(bare), 5, 0))
