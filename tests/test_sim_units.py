"""Pure parts of the vLLM stand-in: versions, tokenizer, output building, faults, GPU state, nvidia-smi."""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from sim import chat, loadlog, nvidia_smi, textgen
from sim.faults import FaultError, Faults, parse_spec
from sim.gpu_state import GpuState, read_state, write_state
from sim.versions import parse_version, traits_for

QUERY = "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw"


@pytest.mark.parametrize("version, keys, nested, detail, prefix, new_line", [
    ("0.10.2", ("reasoning_content",), False, False, False, False),
    ("0.11.0", ("reasoning_content",), False, False, True, False),
    ("0.11.1", ("reasoning", "reasoning_content"), False, False, True, False),
    ("0.13.0", ("reasoning", "reasoning_content"), True, False, True, False),
    ("0.16.0", ("reasoning",), True, True, True, False),
    ("0.33.0", ("reasoning",), True, True, True, True),
])
def test_version_traits(version, keys, nested, detail, prefix, new_line):
    t = traits_for(version)
    assert (t.reasoning_keys, t.nested_errors, t.reasoning_tokens_detail, t.proc_prefix, t.new_server_line) == (
        keys, nested, detail, prefix, new_line)


@pytest.mark.parametrize("version, forced, runner, took, aux", [
    # the V1 runner: `%.4f GiB and` up to 0.11 (and no aux layers line), `%.4f GiB memory` in 0.12/0.13
    ("0.11.0", None, "v1", "took 7.6406 GiB and 12.500000 seconds", None),
    ("0.12.0", None, "v1", "took 7.6406 GiB memory and", "Using auxiliary layers from speculative config: (2, 30, 58)"),
    ("0.18.0", None, "v1", "took 7.64 GiB memory and", "Using auxiliary layers from speculative config: (2, 30, 58)"),
    # a MoE model like the seed host's gets the V1 runner up to 0.28, the V2 one from 0.29
    ("0.28.0", None, "v1", "took 7.64 GiB memory and", "Using auxiliary layers from speculative config: (2, 30, 58)"),
    ("0.29.0", None, "v2", "took 7.64 GiB memory and", "Using Eagle3 auxiliary layers from config: (2, 30, 58)"),
    ("0.33.0", "", "v2", "took 7.64 GiB memory and", "Using Eagle3 auxiliary layers from config: (2, 30, 58)"),
    # VLLM_USE_V2_MODEL_RUNNER forces either; the V2 runner said `GiB and` up to 0.27
    ("0.33.0", "0", "v1", "took 7.64 GiB memory and", "Using auxiliary layers from speculative config: (2, 30, 58)"),
    ("0.27.0", "1", "v2", "took 7.64 GiB and", "Using Eagle3 auxiliary layers from config: (2, 30, 58)"),
    ("0.12.0", "true", "v2", "took 7.6406 GiB and", "Using Eagle3 auxiliary layers from config: (2, 30, 58)"),
    ("0.11.0", "1", "v1", "took 7.6406 GiB and", None),  # no V2 runner yet
])
def test_model_runner_and_its_load_lines_per_version(version, forced, runner, took, aux):
    t = traits_for(version, use_v2_runner=forced)
    assert t.model_runner == runner
    source, message = loadlog.model_loading_took(t, 7.640625, 12.5)
    assert took in message and source.startswith("model_runner.py" if runner == "v2" else "gpu_model_runner.py")
    line = loadlog.aux_layers_line(t, (2, 30, 58))
    assert (line[1] if line else None) == aux
    with pytest.raises(ValueError, match="VLLM_USE_V2_MODEL_RUNNER='yes': expected 0 or 1"):
        traits_for(version, use_v2_runner="yes")


def test_reasoning_field_override_and_bad_versions():
    assert traits_for("0.33.0", "both").reasoning_keys == ("reasoning", "reasoning_content")
    assert traits_for("0.11.0", "reasoning").reasoning_keys == ("reasoning",)
    assert parse_version("v0.18") == (0, 18, 0)
    with pytest.raises(ValueError, match="not a vLLM version"):
        parse_version("latest")
    with pytest.raises(ValueError, match="--reasoning-field"):
        traits_for("0.33.0", "thoughts")


def test_tokenizer_pieces_concatenate_and_specials():
    text = "Hello, world!  It's 3.14 —ok"
    assert "".join(textgen.split_pieces(text)) == text
    assert textgen.encode(text) == textgen.encode(text)  # stable
    ids = textgen.encode("<think>a b</think>x<|im_end|>")
    assert ids[0] == textgen.THINK_ID and textgen.END_THINK_ID in ids and ids[-1] == textgen.EOS_ID
    assert all(0 <= i < textgen.VOCAB_SIZE for i in ids)
    rendered = textgen.render_chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], thinking=False)
    assert rendered.endswith("<think></think>") and "hi" in rendered
    with pytest.raises(ValueError, match="content must be"):
        textgen.message_text(42)


def test_generation_is_deterministic_and_sized():
    a = textgen.generate(7, "What is a prime?", thinking=True)
    b = textgen.generate(7, "What is a prime?", thinking=True)
    assert (a[0].text, a[1].text) == (b[0].text, b[1].text)
    assert a[0].text.startswith('The user asks: "What is a prime?"')
    assert textgen.generate(8, "What is a prime?", thinking=True)[1].text != a[1].text
    r, ans = textgen.generate(7, "x", thinking=True, response_tokens=8000)
    total = len(r.ids) + len(ans.ids)
    assert 8000 <= total < 8100 and 30_000 < len(r.text) + len(ans.text) < 45_000
    assert textgen.encode(ans.text) == ans.ids  # ids are exactly what the tokenizer gives for the text
    r, _ = textgen.generate(7, "x", thinking=False)
    assert r.ids == []


def _out(max_tokens: int, thinking: bool = True) -> tuple[chat.Output, textgen.Segment, textgen.Segment]:
    r, a = textgen.generate(3, "explain caching", thinking=thinking)
    return chat.build_output(r, a, thinking=thinking, max_tokens=max_tokens), r, a


def test_build_output_stop_and_cuts():
    full, r, a = _out(10**6)
    assert full.finish_reason == "stop"
    assert full.ids == [textgen.THINK_ID, *r.ids, textgen.END_THINK_ID, *a.ids, textgen.EOS_ID]
    assert full.reasoning_text == r.text and full.content_text == a.text
    assert full.reasoning_tokens == len(r.ids) + 2
    in_think, _, _ = _out(5)
    assert in_think.finish_reason == "length" and in_think.content_text is None and in_think.reasoning_text
    in_answer, _, _ = _out(len(r.ids) + 2 + 4)
    assert in_answer.finish_reason == "length" and in_answer.content_text and a.text.startswith(in_answer.content_text)
    assert len(in_answer.content_text) < len(a.text)
    off, _, a2 = _out(10**6, thinking=False)
    assert off.reasoning_text is None and off.content_text == a2.text and off.reasoning_tokens == 0
    u = chat.usage(11, full, reasoning_detail=True)
    assert u["completion_tokens"] == len(full.ids) and u["total_tokens"] == 11 + len(full.ids)
    assert "completion_tokens_details" not in chat.usage(11, full, reasoning_detail=False)


def test_chunk_spans_cover_tokens_without_crossing_the_boundary():
    out, _, _ = _out(10**6)
    spans = chat.chunk_spans(out, 3)
    assert spans[0][0] == 0 and spans[-1][1] == len(out.ids)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert all(len(set(out.kinds[s:e])) == 1 and e - s <= 3 for s, e in spans)


def test_a_simulated_drafter_emits_only_the_k_positions_it_drafts(tmp_path):
    """vLLM drafts num_speculative_tokens positions per step and no more: the made-up rates past K never
    reach a stream's chunk size, and K beyond the rates given is served (vLLM takes any K >= 1 for eagle3)."""
    from sim.config import parse_args

    def cfg(k: int):
        spec = json.dumps({"method": "eagle3", "model": str(tmp_path / "ck"), "num_speculative_tokens": k})
        return parse_args(["--model", "m", "--speculative-config", spec, "--acceptance", "0.9,0.9,0.9"])

    assert [(c.num_speculative_tokens, c.chunk_tokens()) for c in map(cfg, (1, 2, 3, 5))] == [
        (1, 2), (2, 3), (3, 4), (5, 4)]


def test_error_bodies():
    assert chat.error_body("m", "NotFoundError", 404, nested=True) == {
        "error": {"message": "m", "type": "NotFoundError", "param": None, "code": 404}}
    assert chat.error_body("m", "NotFoundError", 404, nested=False)["object"] == "error"


def test_faults_parse_and_errors():
    f = Faults()
    f.apply(*parse_spec("crash-during-load:0.5"))
    f.apply(*parse_spec("5xx:3"))
    f.apply(*parse_spec("stall"))
    assert (f.crash_at, f.error_burst, f.stall) == (0.5, 3, True)
    f.apply("clear")
    assert (f.crash_at, f.error_burst, f.stall) == (0.5, 0, False)  # load faults survive a run-time clear
    for spec, msg in (("melt", "unknown fault"), ("5xx", "needs a value"), ("5xx:x", "not a number"),
                      ("crash-during-load:2", "between 0 and 1"), ("die-after:1.5", "whole number"),
                      ("slow:-1", ">= 0")):
        with pytest.raises(FaultError, match=msg):
            Faults().apply(*parse_spec(spec))


def test_progress_bars_match_vllm_shapes():
    bar = loadlog.shard_bar(75, 141, 352)
    assert re.fullmatch(r"Loading safetensors checkpoint shards:  53% Completed \| 75/141 "
                        r"\[05:52<05:09,  4\.69s/it\]", bar), bar
    assert loadlog.shard_bar(0, 8, 0).endswith("| 0/8 [00:00<?, ?it/s]")
    g = loadlog.graph_bar("Capturing CUDA graphs (decode, FULL)", 35, 35, 3.0)
    assert g.startswith("Capturing CUDA graphs (decode, FULL): 100%|██████████| 35/35 [00:03<00:00, ")


def test_gpu_state_dead_pid_and_bad_file(tmp_path):
    path = tmp_path / "g.json"
    state = GpuState.idle(2)
    state.set_memory(80_000)
    state.pid = 2**22 + 12345  # above pid_max on stock kernels: never alive
    write_state(str(path), state)
    seen = read_state(str(path))
    assert [g.memory_used_mib for g in seen.gpus] == [4, 4]
    proc = subprocess.Popen(["sleep", "30"])
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    for _ in range(200):  # a loaded machine may not have run the child's exec yet (its cmdline empty)
        if cmdline.read_bytes().startswith(b"sleep"):
            break
        time.sleep(0.01)
    try:
        state.pid = proc.pid
        write_state(str(path), state)
        assert [g.memory_used_mib for g in read_state(str(path)).gpus] == [80_000, 80_000]
    finally:
        proc.kill()
        proc.wait()
    assert [g.memory_used_mib for g in read_state(str(path)).gpus] == [4, 4]  # the server is gone
    assert len(read_state(str(tmp_path / "missing.json")).gpus) == 8
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a simulated GPU state file"):
        read_state(str(path))


def test_nvidia_smi_formats(tmp_path, capsys, monkeypatch):
    path = tmp_path / "g.json"
    state = GpuState.idle(2)
    state.pid = None
    write_state(str(path), state)
    assert nvidia_smi.main(["--state", str(path), QUERY, "--format=csv,noheader,nounits"]) == 0
    assert capsys.readouterr().out == "0, NVIDIA H200, 4, 143771, 0, 31, 74.60\n1, NVIDIA H200, 4, 143771, 0, 31, 74.60\n"
    monkeypatch.setenv("EAGLE3_SIM_GPU_STATE", str(path))
    assert nvidia_smi.main(["--query-gpu=memory.used,index,fan.speed,power.draw", "--format=csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "memory.used [MiB], index, fan.speed [%], power.draw [W]"
    assert lines[1] == "4 MiB, 0, [N/A], 74.60 W" and len(lines) == 3
    assert nvidia_smi.main(["--query-gpu=index,bogus", "--format=csv"]) == 2
    assert 'Field "bogus" is not a valid field to query.' in capsys.readouterr().out
    assert nvidia_smi.main(["--query-gpu=index", "--format=json"]) == 2
    capsys.readouterr()
    assert nvidia_smi.main(["--simulate-no-driver", QUERY, "--format=csv"]) == 9
    assert capsys.readouterr().out == (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n")
    monkeypatch.setenv("EAGLE3_SIM_NO_DRIVER", "1")
    assert nvidia_smi.main([QUERY, "--format=csv"]) == 9


def test_nvidia_smi_as_a_command(tmp_path):
    path = tmp_path / "g.json"
    write_state(str(path), GpuState.idle(1))
    run = subprocess.run(["python3", "-m", "sim.nvidia_smi", "--state", str(path), QUERY,
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    assert run.returncode == 0 and run.stdout == "0, NVIDIA H200, 4, 143771, 0, 31, 74.60\n"
    json.loads(path.read_text())


def test_compute_apps_list_the_servers_process_on_the_gpus_it_holds(tmp_path, capsys):
    """The table a stage's GPU check reads (backend/train/preflight.py) is the one the telemetry reads:
    a server holding every GPU is listed on each, and nowhere once it exited."""
    from backend.train.preflight import parse_compute_apps, parse_gpu_uuids

    path = tmp_path / "g.json"
    state = GpuState.idle(8)
    state.set_memory(120_000)
    query = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory"
    proc = subprocess.Popen(["sleep", "30"])
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    for _ in range(200):  # a loaded machine may not have run the child's exec yet (its cmdline empty)
        if cmdline.read_bytes().startswith(b"sleep"):
            break
        time.sleep(0.01)
    try:
        state.pid = proc.pid
        write_state(str(path), state)
        assert nvidia_smi.main(["--state", str(path), query, "--format=csv,noheader,nounits"]) == 0
        apps = parse_compute_apps(capsys.readouterr().out)
        assert nvidia_smi.main(["--state", str(path), "--query-gpu=index,uuid", "--format=csv,noheader"]) == 0
        uuids = parse_gpu_uuids(capsys.readouterr().out)
        assert sorted(uuids[i] for i in range(8)) == sorted(a.gpu_uuid for a in apps)
        assert {a.pid for a in apps} == {proc.pid} and {a.name for a in apps} == {"sleep"}
        assert all(a.used_mib == 120_000 for a in apps)
        assert nvidia_smi.main(["--state", str(path), query, "--format=csv"]) == 0
        assert capsys.readouterr().out.splitlines()[0] == "gpu_uuid, pid, process_name, used_gpu_memory [MiB]"
    finally:
        proc.kill()
        proc.wait()
    assert nvidia_smi.main(["--state", str(path), query, "--format=csv,noheader,nounits"]) == 0
    assert capsys.readouterr().out == ""  # the server is gone: nothing holds the GPUs
    assert nvidia_smi.main(["--state", str(path), "--query-compute-apps=gpu_uuid,bogus", "--format=csv"]) == 2
