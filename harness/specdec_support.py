"""Drafters for the tiny verifier, made once per session for the speculative-decoding and bench tests.

- untrained: `speculators train --dry-run`, speculators' own CLI, which builds and saves an initialised
  EAGLE-3 draft (1 decoder layer, its default sliding window) and stops before its trainer, so it runs
  on CPU as it is.
- trained: the pipeline's own train stage (`python -m backend.train`, speculators' Trainer with the CPU
  adapters) for a few epochs on a completed extract run of the tiny verifier's hidden states
  (harness/train_support.Dataset: chat turns like the ones the verifier learned, states from
  sim/hidden_states.py, the one definition); its best checkpoint is what vLLM would load.

`train()` is a plain AdamW loop over speculators' own model and loss on rows given in memory, for the GPU
benchmark (benchmarks/bench_real_engine.py --device cuda), which trains on rows its generation run produced.

The drafters and their tiny verifier are built once per test run under the workers' shared directory
(harness/run_shared.py), `<run>/drafters/xdg` holding the verifier as harness/drafter_support.py places it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
LAYERS = [1, 2, 3]  # aux layer ids for the 4-layer tiny verifier (vLLM's default repeats a layer there)
K = 3
TRAIN_ROWS, EPOCHS, LR, MAX_LEN = 96, 6, 3e-3, 256  # ~1 min of CPU: accepted ~1.8-2.3 at k=3


@dataclass(frozen=True)
class Drafters:
    verifier: Path
    untrained: Path
    trained: Path
    xdg: Path
    losses: tuple[float, ...]  # mean training loss per epoch


def xdg_home(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "xdg"


def env(tmp_path_factory, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(xdg_home(tmp_path_factory)),
            "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


def dry_run(verifier: Path, out: Path, env_vars: dict[str, str], layers: list[int] | None = None) -> Path:
    """An untrained draft checkpoint from speculators' own CLI."""
    cmd = [sys.executable, "-m", "speculators", "train", "--dry-run", "--verifier-name-or-path", str(verifier),
           "--save-path", str(out), "--target-layer-ids", *map(str, layers or LAYERS), "--draft-attn-impl", "sdpa",
           "--ttt-steps", str(K)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env_vars, cwd=out.parent, timeout=300)
    if proc.returncode != 0 or not (out / "config.json").is_file():
        raise AssertionError(f"speculators train --dry-run failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                             f"\n{proc.stderr[-3000:]}")
    return out


def corpus_rows(verifier: Path, count: int = TRAIN_ROWS, seed: int = 11,
                max_len: int = MAX_LEN) -> list[tuple[list[int], list[int]]]:
    """(input ids, loss mask) of the verifier's own answers to demo questions (harness/train_support.py)."""
    from harness.train_support import token_rows

    return [(r["input_ids"], r["loss_mask"]) for r in token_rows(verifier, count, seed, max_len)]


def train(verifier: Path, start: Path, out: Path, *, rows: list[tuple[list[int], list[int]]] | None = None,
          epochs: int = EPOCHS, lr: float = LR, seed: int = 0, layers: list[int] | None = None,
          device: str = "cpu") -> tuple[Path, tuple[float, ...]]:
    """Train the draft checkpoint at `start` on `rows` (default: corpus_rows) and save it to `out`; the
    verifier's hidden states are computed on `device` with sim/hidden_states.py. Returns the mean loss
    per epoch."""
    import torch
    from loguru import logger
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.models.eagle3.data import shift_batch
    from transformers import AutoModelForCausalLM

    from sim import hidden_states

    logger.disable("speculators")
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # a busy small machine: a second thread mostly waits for the first
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(verifier)).to(device).eval()
        batches = []
        asked = hidden_states.speculators_ids(layers or LAYERS, hidden_states.num_layers(model))
        for ids, mask in rows if rows is not None else corpus_rows(verifier):
            # on the model's device; float and cloned out of inference mode: a trainable input
            states = hidden_states.compute(model, torch.tensor(ids, device=device), asked).float().clone()
            n = len(ids)
            batches.append({k: v.to(device) for k, v in shift_batch({
                "input_ids": torch.tensor(ids), "loss_mask": torch.tensor(mask),
                "hidden_states": states[:, :-1].reshape(n, -1).cpu(), "verifier_last_hidden_states": states[:, -1].cpu(),
                "lengths": torch.tensor([n]), "position_ids": torch.arange(n)}).items()})
        del model
        config = Eagle3DraftModel.config_class.from_pretrained(str(start))
        config.transformer_layer_config._attn_implementation = "sdpa"  # FlexAttention has no CPU backward
        draft = Eagle3DraftModel.from_pretrained(str(start), config=config, dtype=torch.float32).float()
        draft = draft.to(device).train()
        opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr)
        loss_config = resolve_loss_config("kl_div", "eager")  # the fused loss needs Triton
        losses = []
        for _ in range(epochs):
            total = 0.0
            for b in batches:
                n = b["input_ids"].shape[0]
                _, loss, _ = draft(hidden_states=b["hidden_states"][None], input_ids=b["input_ids"][None],
                                   document_ids=torch.zeros(1, n, dtype=torch.long, device=device),
                                   loss_mask=b["loss_mask"][None].bool(), position_ids=b["position_ids"][None],
                                   verifier_last_hidden_states=b["verifier_last_hidden_states"][None],
                                   ttt_steps=K, loss_config=loss_config)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(loss.detach())
            losses.append(total / len(batches))
        draft.cpu().save_pretrained(str(out))
    finally:
        torch.set_num_threads(threads)
    return out, tuple(losses)


def stage_drafter(verifier: Path, root: Path, env_vars: dict[str, str], *, epochs: int = EPOCHS,
                  rows: int = TRAIN_ROWS) -> tuple[Path, tuple[float, ...]]:
    """A drafter trained by the train stage on a completed extract run; (its best checkpoint, the train
    loss of the first and the last logged step)."""
    import json

    from harness import train_support as ts

    data = ts.Dataset(root / "data", verifier, train=rows, heldout=8, layers=LAYERS)
    work = root / "work"
    data.extract_run(work)
    proc = subprocess.run(ts.stage_cmd("backend.train", "--work-dir", str(work), "--verifier", str(verifier),
                                       "--run-id", "train-1", "--epochs", str(epochs), "--seq-length", str(MAX_LEN),
                                       "--lr", str(LR), "--optimizer", "adamw", "--speculative-tokens", str(K)),
                          env=env_vars, cwd=REPO, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise AssertionError(f"the train stage failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    summary = json.loads((work / "runs" / "train-1" / "summary.json").read_text())
    losses = [e["loss"] for e in ts.read_events(work / "runs" / "train-1")
              if e.get("kind") == "progress" and e.get("phase") == "train" and isinstance(e.get("loss"), float)]
    return Path(summary["outputs"]["checkpoint"]), (losses[0], losses[-1]) if losses else ()


def make_drafters(tmp_path_factory) -> Drafters:
    """Built once per test run, whatever the number of workers (harness/run_shared.py): a minute or more
    of CPU each time, and no test changes them."""
    import json

    import pytest  # a fixture's helper: only the test session builds these

    from harness.run_shared import FixedTemp, held, run_root

    for mod in ("torch", "transformers", "tokenizers", "speculators"):
        pytest.importorskip(mod)
    from harness.drafter_support import tiny_verifier

    at = FixedTemp(run_root(tmp_path_factory) / "drafters")
    record = at.root / "drafters.json"
    with held(at.root.with_suffix(".lock")):
        if record.is_file():
            made = json.loads(record.read_text())
            return Drafters(**{k: Path(v) for k, v in made.items() if k != "losses"}, losses=tuple(made["losses"]))
        verifier = tiny_verifier(at)
        root = at.mktemp("made")
        untrained = dry_run(verifier, root / "untrained", env(at))
        trained, losses = stage_drafter(verifier, root / "trained", env(at))
        drafters = Drafters(verifier=verifier, untrained=untrained, trained=trained, xdg=xdg_home(at), losses=losses)
        record.write_text(json.dumps({k: str(v) if isinstance(v, Path) else list(v)
                                      for k, v in vars(drafters).items()}))
        return drafters
