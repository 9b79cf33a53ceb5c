"""Shared pieces of the train/verify tests: the tiny verifier, a prepared dataset with its hidden states,
and completed prepare/extract runs written the way those stages write them (manifest, events, summary).

The tiny verifier and the stage environment are harness/drafter_support.py's (one build per session). Rows are
the verifier's own answers to demo questions; hidden states from sim/hidden_states.py, the one definition.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from backend.contract.events import EventLog
from backend.contract.runs import Manifest, open_run_dir
from harness.drafter_support import REPO, run_stage, stage_cmd, stage_env, tiny_verifier, xdg_home  # noqa: F401

LAYERS = [1, 2, 3]  # aux layer ids for the 4-layer tiny verifier (speculators' default needs >= 6 layers)


def token_rows(verifier: Path, count: int, seed: int, max_len: int = 256) -> list[dict[str, list[int]]]:
    """Rows as speculators' prepare-data writes them (input ids, a loss mask over the completion), made
    as the pipeline makes them: demo questions answered by the verifier itself at the demo's sampling
    settings. A drafter learns to predict that model, not the text the model was trained on."""
    from sim.tinycorpus import demo_questions
    from sim.tinylm_text import Sampling

    text = _tiny_text(verifier)
    rows = []
    for i, q in enumerate(demo_questions(count, seed=seed)):
        prompt = text.chat_prompt([{"role": "user", "content": q}], thinking=True)
        completion = text._generate(prompt, max_len, Sampling(temperature=0.6, top_p=0.95, seed=seed * 1000 + i))
        ids = (prompt + completion)[:max_len]
        rows.append({"input_ids": ids, "loss_mask": ([0] * len(prompt) + [1] * len(completion))[:max_len]})
    return rows


_TEXTS: dict[Path, Any] = {}


def _tiny_text(verifier: Path) -> Any:
    from sim.tinylm_text import TinyText

    if verifier not in _TEXTS:
        _TEXTS[verifier] = TinyText(verifier)
    return _TEXTS[verifier]


def write_prepared(out: Path, rows: list[dict[str, list[int]]]) -> Path:
    """An Arrow dataset (input_ids, loss_mask, seq_len; torch format) as `speculators train` reads it."""
    from datasets import Dataset

    data = Dataset.from_dict({"input_ids": [r["input_ids"] for r in rows],
                              "loss_mask": [r["loss_mask"] for r in rows],
                              "seq_len": [len(r["input_ids"]) for r in rows]})
    data.set_format("torch")
    data.save_to_disk(str(out))
    return out


def write_token_freq(path: Path, rows: list[dict[str, list[int]]]) -> Path:
    import torch
    from collections import Counter

    freq: Counter[int] = Counter()
    for r in rows:
        freq.update(t for t, m in zip(r["input_ids"], r["loss_mask"]) if m)
    torch.save(dict(freq), path)
    return path


def write_hidden_states(out: Path, verifier: Path, rows: list[dict[str, list[int]]], layers=LAYERS) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from sim import hidden_states

    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(verifier)).eval()
        # what speculators' launcher asks vLLM for: the aux ids, then the final layer
        asked = hidden_states.speculators_ids(layers, hidden_states.num_layers(model))
        for i, r in enumerate(rows):
            hidden_states.save(out / hidden_states.file_name(i), r["input_ids"],
                               hidden_states.compute(model, r["input_ids"], asked))
    finally:
        torch.set_num_threads(threads)
    return out


def completed_run(work_dir: Path, stage: str, run_id: str, outputs: dict[str, str], *,
                  identity: dict[str, Any] | None = None, status: str | None = "completed",
                  **summary: Any) -> Path:
    """A finished (or, with status None, still running) run of `stage` as backend/contract/lookup.py reads it."""
    manifest = Manifest(stage=stage, run_id=run_id, identity=identity or {"test": run_id})
    run_dir = open_run_dir(str(work_dir), run_id, manifest)
    log = EventLog(run_dir.events_path, stage, run_id)
    log.emit("start", total=1, manifest=manifest.to_dict())
    if status is not None:
        body = {"stage": stage, "run_id": run_id, "status": status, "outputs": outputs, **summary}
        if status == "completed":
            run_dir.write_summary(body)
        log.emit("finish", status=status, summary=body)
    log.close()
    return Path(run_dir.path)


class Dataset:
    """Train and held-out rows, their prepared datasets and hidden states, and an extract run naming them."""

    def __init__(self, root: Path, verifier: Path, train: int = 48, heldout: int = 12, layers=LAYERS):
        self.root, self.verifier, self.layers = root, verifier, list(layers)
        self.train_rows = token_rows(verifier, train, seed=11)
        self.heldout_rows = token_rows(verifier, heldout, seed=12)
        self.train_data = write_prepared(root / "data" / "train", self.train_rows)
        self.heldout_data = write_prepared(root / "data" / "heldout", self.heldout_rows)
        self.token_freq = write_token_freq(root / "data" / "token_freq.pt", self.train_rows)
        self.train_hs = write_hidden_states(root / "data" / "train_hs", verifier, self.train_rows, layers)
        self.heldout_hs = write_hidden_states(root / "data" / "heldout_hs", verifier, self.heldout_rows, layers)

    def outputs(self) -> dict[str, str]:
        return {"train_data": str(self.train_data), "heldout_data": str(self.heldout_data),
                "token_freq": str(self.token_freq), "train_hidden_states": str(self.train_hs),
                "heldout_hidden_states": str(self.heldout_hs)}

    def extract_run(self, work_dir: Path, run_id: str = "extract-1", **kw: Any) -> Path:
        return completed_run(work_dir, "extract", run_id, self.outputs(), aux_layer_ids=self.layers,
                             identity={"verifier": str(self.verifier), "aux_layer_ids": self.layers}, **kw)


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete event (a line torn by a kill -9 is skipped, as the console's reader does)."""
    from backend.contract.events import parse_events

    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    events, _ = parse_events(path.read_bytes())
    return [{"ts": e.ts, "kind": e.kind, "stage": e.stage, "run_id": e.run_id, **e.data} for e in events]


# ---- a nested, remote-code verifier (Kimi-K2.5 style) -------------------------------------------------
NESTED_CONFIG_PY = '''
from transformers import LlamaConfig, PretrainedConfig


class TinyNestedConfig(PretrainedConfig):
    model_type = "tiny_nested"
    sub_configs = {"text_config": LlamaConfig}

    def __init__(self, text_config=None, vision_hidden_size=64, **kwargs):
        if isinstance(text_config, dict):
            text_config = LlamaConfig(**text_config)
        self.text_config = text_config or LlamaConfig()
        self.vision_hidden_size = vision_hidden_size
        super().__init__(**kwargs)
'''
NESTED_MODEL_PY = '''
import torch
from transformers import LlamaForCausalLM, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from .configuration_tiny_nested import TinyNestedConfig


class VisionStub(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm = LlamaRMSNorm(hidden)


class TinyNestedForCausalLM(PreTrainedModel):
    config_class = TinyNestedConfig
    base_model_prefix = ""

    def __init__(self, config):
        super().__init__(config)
        self.language_model = LlamaForCausalLM(config.text_config)
        self.vision_model = VisionStub(config.vision_hidden_size)
        self.post_init()

    def get_decoder(self):
        return self.language_model.model

    def forward(self, input_ids=None, **kwargs):
        return self.language_model(input_ids=input_ids, **kwargs)
'''
DECOY = 7.0  # the vision tower's norm: same shape as the language model's, unmistakable values


def nested_verifier(out: Path, tiny: Path) -> Path:
    """The tiny verifier's weights under `language_model.`, a decoy `vision_model.norm.weight` (the suffix
    speculators' lookup would prefer), a config with `text_config` and classes named in `auto_map`."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, out / name)
    text = json.loads((tiny / "config.json").read_text())
    config = {"architectures": ["TinyNestedForCausalLM"], "model_type": "tiny_nested",
              "auto_map": {"AutoConfig": "configuration_tiny_nested.TinyNestedConfig",
                           "AutoModelForCausalLM": "modeling_tiny_nested.TinyNestedForCausalLM"},
              "text_config": text, "vision_hidden_size": text["hidden_size"], "tie_word_embeddings": False}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "configuration_tiny_nested.py").write_text(NESTED_CONFIG_PY)
    (out / "modeling_tiny_nested.py").write_text(NESTED_MODEL_PY)
    tensors = {f"language_model.{k}": v for k, v in load_file(str(tiny / "model.safetensors")).items()}
    tensors["vision_model.norm.weight"] = torch.full((text["hidden_size"],), DECOY)
    save_file(tensors, str(out / "model.safetensors"))
    return out
