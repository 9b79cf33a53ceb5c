"""Load ETA from the best signal (pure)."""
from console.telemetry.eta import LoadRecord, downtime_text, estimate_load, last_load, parse_load_history
from console.snapshot import GpuInfo


def gpus(used):
    return [GpuInfo(index=i, name="H200", memory_used_mib=used, memory_total_mib=143771) for i in range(8)]


def test_live_shards_win():
    est = estimate_load(elapsed_s=100, shards=(25, 100), shard_eta_s=290, shards_live=True, gpus=gpus(1000),
                        expected_weights_gib=70, baseline_mib=0, previous=None)
    assert (est.source, est.fraction, est.eta_s) == ("shards", 0.25, 290)


def test_gpu_memory_against_previous_weights():
    prev = LoadRecord(model="m", started=0, ready=1320, weights_gib=70.0, weights_s=1000)
    # 35 GiB of 70 loaded after 500 s: half way, 500 s to go
    est = estimate_load(elapsed_s=500, shards=None, shard_eta_s=None, shards_live=False,
                        gpus=gpus(35 * 1024 + 500), expected_weights_gib=None, baseline_mib=500, previous=prev)
    assert est.source == "gpu_memory" and est.fraction == 0.5 and round(est.eta_s) == 500


def test_previous_load_duration_when_no_memory_signal():
    prev = LoadRecord(model="m", started=0, ready=1320)
    est = estimate_load(elapsed_s=320, shards=None, shard_eta_s=None, shards_live=False, gpus=[],
                        expected_weights_gib=None, baseline_mib=None, previous=prev)
    assert est.source == "previous_load" and est.eta_s == 1000


def test_nothing_known():
    est = estimate_load(elapsed_s=5, shards=(3, 10), shard_eta_s=None, shards_live=False, gpus=[],
                        expected_weights_gib=None, baseline_mib=None, previous=None)
    assert est.source is None and est.eta_s is None


def test_history_parsing_skips_torn_lines():
    text = ('{"model":"m","started":1,"ready":101,"weights_gib":7.6}\n{"model":"m","sta\n'
            '{"model":"m","started":200,"ready":260}\n{"model":"other","started":0,"ready":999}\n')
    recs = parse_load_history(text)
    assert len(recs) == 3 and recs.skipped == 1
    assert last_load(recs, "m").ready == 260


def test_history_numbers_are_finite_and_typed_or_the_record_is_skipped():
    """The host's file is read like any answer the host sends: a wrong-typed or non-finite number
    makes its record unreadable (counted), never a TypeError in the ETA or an infinite downtime."""
    bad = ['{"model":"m","started":1,"ready":101,"weights_gib":"70"}',
           '{"model":"m","started":1,"ready":1e999}', '{"model":"m","started":NaN,"ready":5}',
           '{"model":"m","started":1,"ready":101,"weights_s":true}', '{"model":7,"started":1,"ready":5}',
           '{"model":"m","started":1,"ready":101,"baseline_mib":-1}', '{"model":"m","started":"1","ready":5}',
           '{"model":"m","started":1,"ready":101,"settings":5}', "[1,2]", "[" * 100_000]
    good = '{"model":"m","started":1,"ready":101,"phases":{"compiling":1e999,"loading_weights":4}}'
    recs = parse_load_history("\n".join([*bad, good, '{"model":"m","started":5,"ready":5}']))
    assert recs.skipped == len(bad) and len(recs) == 1  # the zero-length load is dropped, not counted
    assert recs[0].phases == {"loading_weights": 4.0}
    assert "inf" not in downtime_text(2, recs, "m", 600) and "about 3 min" in downtime_text(2, recs, "m", 600)
    est = estimate_load(elapsed_s=5, shards=None, shard_eta_s=None, shards_live=False, gpus=[],
                        expected_weights_gib=None, baseline_mib=None, previous=recs[0])
    assert est.source == "previous_load" and est.eta_s == 0.0


def test_checkpoint_size_gives_the_first_loads_expected_weights(tmp_path):
    """Before any load was seen on a host, the weights on disk over the GPU count say what to expect."""
    import asyncio

    from console.profile import profile_from_dict
    from console.telemetry.collector import Collector
    from console.host.local import LocalHost

    model = tmp_path / "model"
    model.mkdir()
    for i in range(4):  # sparse files: 4 x 2 GiB of "weights"
        with open(model / f"model-0000{i}-of-00004.safetensors", "wb") as f:
            f.truncate(2 * 2**30)
    (model / "config.json").write_text("{}")
    p = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                           "server": {"model_path": str(model), "manager": "tmux", "unit": "e3-ckpt"},
                           "paths": {"work_dir": str(tmp_path / "work")}, "gpus": {"count": 8}})
    c = Collector(p, LocalHost())
    asyncio.run(c.connect())
    assert c.checkpoint_bytes == 8 * 2**30
    assert c.expected_weights_gib() == 1.0


def test_the_downtime_is_said_from_the_hosts_measured_loads():
    from console.telemetry.eta import LoadRecord, downtime_text

    history = [LoadRecord("kimi", 1000.0, 1000.0 + 22 * 60), LoadRecord("other", 0.0, 60.0),
               LoadRecord("kimi", 0.0, 600.0)]
    assert downtime_text(2, history, "kimi", 3600) == (
        "2 server loads of about 22 min each (the last load of kimi here took 22 min): about 44 min of loading in all")
    assert downtime_text(1, history, "other", 3600).startswith("1 server load of about 60 s each")
    assert downtime_text(3, [], "kimi", 3600) == (
        "3 server loads; no load of kimi measured on this host yet ([server] load_timeout_s allows 60 min each)")


def test_the_span_a_baseline_is_down_comes_from_this_hosts_completed_runs():
    from console.snapshot import RunInfo
    from console.telemetry.eta import span_text

    runs = [RunInfo("extract", "e1", "done", started=1000.0, last_event={"ts": 4600.0}),
            RunInfo("train", "t0", "done", started=100.0, last_event={"ts": 200.0}),  # older: not the estimate
            RunInfo("train", "t1", "done", started=5000.0, last_event={"ts": 5000.0 + 4 * 3600}),
            RunInfo("train", "t2", "failed", started=90000.0, last_event={"ts": 90010.0})]  # not completed
    assert span_text(["extract", "train"], runs) == (
        "about 5.0 h by the last completed runs on this host (extract about 60 min; train about 4.0 h)")
    assert span_text(["extract", "train"], runs[:1]) == (
        "more than 60 min by the last completed runs on this host (extract about 60 min; train unknown: first run)")
    assert span_text(["extract", "train"], []) == \
        "unknown: first run (no completed extract or train run on this host yet)"
