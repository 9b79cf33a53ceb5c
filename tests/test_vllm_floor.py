"""The oldest vLLM an extraction runs on (backend/kit/vllm_floor.py): 0.17.0 for every verifier, 0.25.0 for the
DeepSeek-V2 family (Kimi-K2.5 wraps one), whose final-layer state older releases do not return. A baseline
reporting an older release is refused before the swap stops it: on the demo host, its stand-in told to
imitate vLLM 0.24.0, with a Kimi-K2.5-shaped verifier config."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from backend.ask import main
from backend.kit.verifier import read_verifier
from backend.kit.vllm_floor import extraction_floor, parse_version, refusal
from console import demo
from console.session import Session
from harness.polling import until

# Kimi-K2.5's config.json, the fields read here (the language model nested under text_config)
KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
        "text_config": {"model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168,
                        "vocab_size": 163840, "torch_dtype": "bfloat16"}}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8, "hidden_size": 16,
         "vocab_size": 100}


def verifier(tmp: Path, config: dict) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(config))
    return tmp


@pytest.mark.parametrize("config, floor", [
    (KIMI, "0.25.0"),
    ({**LLAMA, "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}, "0.25.0"),
    ({**LLAMA, "model_type": "deepseek_v2", "architectures": []}, "0.25.0"),
    (LLAMA, "0.17.0"),
])
def test_the_floor_follows_the_verifiers_family(tmp_path, config, floor):
    assert read_verifier(str(verifier(tmp_path / "v", config))).vllm_floor().text == floor


def test_versions_below_the_floor_are_refused_with_why():
    kimi = extraction_floor(("kimi_k25", "kimi_k2"))
    why = refusal("0.24.0", kimi)
    assert why and why.startswith("the baseline reports vLLM 0.24.0, extraction needs vLLM >= 0.25.0: the verifier "
                                  "is a DeepSeek-V2-family model (kimi_k25/kimi_k2)")
    assert refusal("0.25.0", kimi) is None and refusal("0.33.1.dev4+g1234", kimi) is None
    assert refusal("0.24.0", extraction_floor(("llama",))) is None
    assert refusal("0.16.2", extraction_floor(("llama",))) is not None
    assert parse_version("v0.25") == (0, 25, 0) and parse_version("x" * 200) is None and parse_version("1") is None


def test_a_server_that_does_not_answer_is_not_checked(tmp_path, capsys):
    path = verifier(tmp_path / "v", KIMI)
    assert main(["vllm-floor", "--verifier", str(path), "--url", "http://127.0.0.1:9/version"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["floor"] == "0.25.0" and found["version"] is None and found["refusal"] is None
    assert "did not answer" in found["note"]


@pytest.mark.timeout(180)
async def test_a_baseline_older_than_the_floor_is_refused_before_the_swap(tmp_path):
    work = tmp_path / "demo"
    profile = await demo.start(work, speed=10, seed_shape=True, vllm_version="0.24.0")
    try:
        profile.drafter.verifier = str(verifier(tmp_path / "kimi", KIMI))
        profile.drafter.aux_layer_ids = []
        base = f"http://127.0.0.1:{profile.server.port}"

        async def version() -> str | None:
            try:
                async with httpx.AsyncClient(timeout=2) as client:
                    r = await client.get(f"{base}/version")
                    return r.json()["version"] if r.status_code == 200 else None
            except httpx.HTTPError:
                return None

        assert await until(version, "the stand-in's /version", timeout=90) == "0.24.0"
        async with Session(profile, interval=0.5) as session:
            result = await session.start_stage("extract", input_run="prep1")
            assert not result.ok
            assert ("the baseline reports vLLM 0.24.0, extraction needs vLLM >= 0.25.0: the verifier is a "
                    "DeepSeek-V2-family model (kimi_k25/kimi_k2) and vLLM returns its final layer's hidden state"
                    in result.message), result.message
            assert f"the program the unit {profile.server.unit} runs) to 0.25.0 or later; nothing was stopped" \
                in result.message
            # nothing was stopped or started: the baseline answers as before, no run or plan was written
            assert await version() == "0.24.0"
            assert not (work / "runs").exists() or not any((work / "runs").iterdir())
            assert not list(work.glob("plans/*.extract.json"))
    finally:
        await demo.stop(work)
