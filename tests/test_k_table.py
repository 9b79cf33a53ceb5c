"""verify's K table: expected accepted length per K from the per-position acceptance, and the K that pays at
the draft's cost (backend/verify/k_table.py), checked against hand computations."""
from __future__ import annotations

import pytest

from backend.verify import k_table as kt
from backend.verify.report import table

RATES = [0.8, 0.6, 0.3]  # P(at least 1, 2, 3 accepted)


def test_the_table_matches_a_hand_computation():
    t = kt.k_table(RATES, 0.1, "given")
    # E[K] = 1 + p0 + ... ; speedup = E[K] / (1 + 0.1 K)
    assert [r.expected_length for r in t.rows] == [1.8, 2.4, 2.7]
    assert [r.speedup for r in t.rows] == [pytest.approx(1.8 / 1.1, abs=1e-4), 2.0, pytest.approx(2.7 / 1.3, abs=1e-4)]
    assert t.recommended == 3
    # dearer drafts: K=1 and K=2 tie at 1.2 (the smaller wins), and at c=2 nothing pays
    assert kt.k_table(RATES, 0.5, "given").recommended == 1
    assert kt.k_table(RATES, 2.0, "given").recommended == 0
    with pytest.raises(ValueError):
        kt.k_table(RATES, -1.0, "given")


def test_the_draft_cost_comes_from_a_bench_at_the_lowest_concurrency():
    comparison = {"rows": [
        {"concurrency": 8, "label": "baseline", "ratio": None, "median_tpot_ms": 20.0, "acceptance_length": None},
        {"concurrency": 8, "label": "ours", "ratio": 1.5, "median_tpot_ms": 14.0, "acceptance_length": 2.2},
        {"concurrency": 1, "label": "baseline", "ratio": None, "median_tpot_ms": 10.0, "acceptance_length": None},
        {"concurrency": 1, "label": "ours", "ratio": 2.0, "median_tpot_ms": 5.0, "acceptance_length": 2.4}]}
    # one step: 5 ms x 2.4 tokens = 12 ms = T_v (10 ms) + 3 T_d  ->  c = 2/3/10
    assert kt.draft_cost_from_bench(comparison, 3) == pytest.approx(0.2 / 3)
    assert kt.draft_cost_from_bench({"rows": comparison["rows"][:1]}, 3) is None
    assert kt.draft_cost_from_bench({}, 3) is None
    assert kt.served_k(comparison) is None  # no acceptance rate: the bench cannot say its K


def test_the_draft_cost_is_taken_at_the_k_the_bench_served():
    """A bench of several K (`run bench --k 2,3`) served the drafter at K=2 first: its row's own counters
    say so (draft tokens = K x drafts), and c divides by that K, not the trained one."""
    # K=2: 100 drafts, 200 draft tokens, 120 accepted -> length 2.2, rate 0.6
    comparison = {"rows": [
        {"concurrency": 1, "label": "baseline", "ratio": None, "median_tpot_ms": 10.0, "acceptance_length": None},
        {"concurrency": 1, "label": "drafter-k2", "ratio": 1.8, "median_tpot_ms": 5.0, "acceptance_length": 2.2,
         "acceptance_rate": 0.6},
        {"concurrency": 1, "label": "drafter-k3", "ratio": 1.9, "median_tpot_ms": 4.5, "acceptance_length": 2.5,
         "acceptance_rate": 0.5}]}
    assert kt.served_k(comparison) == 2
    # one step: 5 ms x 2.2 tokens = 11 ms = T_v (10 ms) + 2 T_d  ->  c = 0.1 / 2
    assert kt.draft_cost_from_bench(comparison, kt.served_k(comparison)) == pytest.approx(0.05)
    nothing = {"rows": [comparison["rows"][0], {**comparison["rows"][1], "acceptance_length": 1.0,
                                                "acceptance_rate": 0.0}]}
    assert kt.served_k(nothing) is None


def test_verify_prints_the_table_with_its_recommendation():
    t = kt.k_table(RATES, 0.1, "assumed: no bench with the drafter yet")
    report = {"checkpoint": "/c", "checks": [], "k_table": t.to_dict()}
    text = table(report)
    assert "draft step = 0.100 verifier steps, assumed: no bench with the drafter yet" in text
    assert "  3   2.700             2.077  <- recommended" in text
    report["k_table"] = kt.k_table(RATES, 2.0, "given").to_dict()
    assert "no K pays at this draft cost" in table(report)


def test_the_training_pane_shows_the_k_table():
    from console.telemetry.snapshot import RunInfo
    from console.ui.panes.training import verify_markup

    t = kt.k_table(RATES, 0.1, "assumed: [b]no bench[/b]")
    acc = {"per_position": RATES, "mean_accepted": 1.7, "mean_acceptance_length": 2.7}
    run = RunInfo(run_id="v", stage="verify", state="done",
                  last_event={"checks": [], "acceptance": {"k": 3, "trained": acc, "untrained": acc},
                              "k_table": t.to_dict()})
    text = verify_markup(run).plain
    assert "1:1.80/x1.64  2:2.40/x2.00  3:2.70/x2.08   recommended K=3  assumed: [b]no bench[/b]" in text


def test_a_hostile_k_table_reads_as_missing_or_bounded():
    from backend.verify.report import read_k_table

    assert read_k_table({"rows": [{"k": 1, "expected_length": float("nan"), "speedup": 1.0}], "draft_cost": 0.1}) is None
    assert read_k_table({"rows": "x"}) is None and read_k_table(None) is None
    big = {"rows": [{"k": i + 1, "expected_length": 1.5, "speedup": 1.2} for i in range(10_000)], "draft_cost": 0.1,
           "recommended": float("inf"), "cost_source": "x" * 10_000}
    t = read_k_table(big)
    assert len(t.rows) == 32 and t.recommended == 0 and len(t.cost_source) == 120
    assert "no K pays" in table({"checkpoint": "/c", "checks": [], "k_table": big})
