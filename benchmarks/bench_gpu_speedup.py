"""On a machine with one GPU: build a small verifier, train an EAGLE-3 drafter for it, serve both through
real vLLM and measure the speed-up and the acceptance, side by side. Not part of the CPU test suite.

    python benchmarks/bench_gpu_speedup.py [--work DIR] [--port 8123] [--samples 256] [--prompts 64]
                                           [--max-tokens 256] [--concurrency 1,8] [--layers 12] [--hidden 1024]

Needs, on that machine: a CUDA torch, vllm (its `vllm serve` and `vllm bench serve` on PATH), speculators,
transformers, tokenizers, aiohttp; nothing is downloaded. Target: under 10 minutes on one GPU.

1. Verifier (~140M parameters by default): the tiny verifier's tokenizer and chat template
   (sim/tinylm.py, built locally on first use), a wider and deeper Llama trained for a minute on the GPU
   on the same generated chat turns, saved as an ordinary Hugging Face directory.
2. Baseline: `vllm serve` of it; the generation stage (`python -m backend.generate`, token ids on) answers
   the training prompts; the bench stage (`python -m backend.bench`, `vllm bench serve` underneath)
   measures it on held-out prompts at each concurrency level.
3. Drafter: `speculators train --dry-run` builds the draft; it is trained on the generated token rows'
   hidden states (sim/hidden_states.py on the GPU) with speculators' model and loss (the loop of
   tests/specdec_support.train; switch to the train stage, backend/train, once it is merged).
4. `vllm serve` again with `--speculative-config` (eagle3, the checkpoint, 3 tokens), checked by its
   `Using [Eagle3] auxiliary layers from ...` log line; the bench stage measures it on the same prompts against the
   baseline run and prints the table (exit 3 from the bench means the drafter was slower).

Prints each phase's wall time, the comparison table, and per level the speed-up and acceptance length.
Written without a GPU to run it on: every step is what the CPU tests run, on cuda, but the vLLM command
lines and the end-to-end timing are unverified here.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.bench.compare import comparison_from_dict, format_table  # noqa: E402
from sim import tinycorpus, tinylm  # noqa: E402
from tests.specdec_support import dry_run, train  # noqa: E402

MODEL = "gpu-tiny"
K = 3
BUDGET_S = 600
TIMES: dict[str, float] = {}


def phase(name: str, started: float) -> None:
    TIMES[name] = time.monotonic() - started
    print(f"[{sum(TIMES.values()):6.0f} s] {name}: {TIMES[name]:.1f} s", flush=True)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1"}


# ---- 1. the verifier -----------------------------------------------------------------------------------
def build_verifier(out: Path, layers: int, hidden: int, steps: int, samples: int) -> Path:
    import torch
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tiny = tinylm.ensure_model()  # its tokenizer and chat template; built on the CPU at first use
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tiny / name, out / name)
    tiny_cfg = json.loads((tiny / "config.json").read_text())
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    config = LlamaConfig(vocab_size=tiny_cfg["vocab_size"], hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 256,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         bos_token_id=tiny_cfg["bos_token_id"], eos_token_id=tiny_cfg["eos_token_id"],
                         pad_token_id=tiny_cfg["pad_token_id"])
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).cuda()
    turns = tinycorpus.samples(samples, seed=1)
    ids: list[int] = []
    labels: list[int] = []
    for t in turns:  # completions learned, prompts masked, as sim/tinylm.py trains its model
        p, c = tok.encode(t.prompt).ids, tok.encode(t.completion).ids
        ids += p + c
        labels += [-100] * len(p) + c
    block, batch = 512, 32
    usable = len(ids) // block * block
    blocks = torch.tensor(ids[:usable]).view(-1, block).cuda()
    targets = torch.tensor(labels[:usable]).view(-1, block).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=6e-4, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        pick = torch.randint(0, len(blocks), (batch,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=blocks[pick], labels=targets[pick]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  verifier step {step}: loss {loss.item():.3f}", flush=True)
    model.generation_config = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.95,
                                               bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.to(torch.bfloat16).cpu().save_pretrained(str(out))
    del model, opt
    torch.cuda.empty_cache()
    return out


# ---- vLLM ----------------------------------------------------------------------------------------------
class Vllm:
    def __init__(self, verifier: Path, port: int, log: Path, drafter: Path | None = None):
        self.url = f"http://127.0.0.1:{port}"
        argv = ["vllm", "serve", str(verifier), "--served-model-name", MODEL, "--host", "127.0.0.1",
                "--port", str(port), "--max-model-len", "4096", "--gpu-memory-utilization", "0.5", "--seed", "0"]
        if drafter is not None:
            argv += ["--speculative-config", json.dumps({"method": "eagle3", "model": str(drafter),
                                                         "num_speculative_tokens": K,
                                                         "draft_tensor_parallel_size": 1})]
        self.log = log
        self._out = open(log, "wb")
        print("  " + " ".join(argv), flush=True)
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, env=env(),
                                     start_new_session=True)

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"vllm serve exited {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)
        self.stop()
        raise SystemExit(f"vllm serve not ready in {timeout:g} s:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


def run(argv: list[str], ok: tuple[int, ...] = (0,), timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=timeout)
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(argv[:4])} ... exited {proc.returncode}:\n{proc.stdout[-4000:]}\n"
                         f"{proc.stderr[-4000:]}")
    return proc


def bench(work: Path, url: str, verifier: Path, run_id: str, label: str, a: argparse.Namespace,
          *extra: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "backend.bench", "--work-dir", str(work), "--run-id", run_id,
                "--endpoint", url, "--model", MODEL, "--tokenizer", str(verifier), "--prompts",
                str(work / "heldout.jsonl"), "--label", label, "--concurrency", a.concurrency,
                "--num-prompts", str(a.prompts), "--max-tokens", str(a.max_tokens), "--temperature", "0",
                "--client", "auto", "--ready-timeout", "60", *extra], ok=(0, 3))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="/tmp/e3-gpu-speedup")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--samples", type=int, default=256, help="training prompts answered by the verifier")
    p.add_argument("--prompts", type=int, default=64, help="held-out prompts per bench level")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--verifier-steps", type=int, default=300)
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available() or shutil.which("vllm") is None:
        raise SystemExit("needs a CUDA GPU and vllm on PATH (this benchmark is not for the CPU test machine)")
    work = Path(a.work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    aux = [2, a.layers // 2, a.layers - 3]  # vLLM's default ids, distinct from 6 layers on
    started = time.monotonic()

    t = time.monotonic()
    verifier = build_verifier(work / "verifier", a.layers, a.hidden, a.verifier_steps, 2000)
    phase("verifier built", t)

    # the prompts: the demo's questions and the corpus' others, split once: training vs held out
    questions = tinycorpus.demo_questions(a.samples + a.prompts)
    train_q, heldout_q = questions[:a.samples], questions[a.samples:]
    for name, qs in (("train.jsonl", train_q), ("heldout.jsonl", heldout_q)):
        (work / name).write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n"
                                         for q in qs))

    t = time.monotonic()
    server = Vllm(verifier, a.port, work / "vllm-baseline.log")
    try:
        server.wait_ready()
        phase("baseline vllm ready", t)
        t = time.monotonic()
        run([sys.executable, "-m", "backend.generate", "--dataset", str(work / "train.jsonl"), "--work-dir", str(work),
             "--run-id", "gen", "--endpoint", server.url, "--model", MODEL, "--max-tokens", "512",
             "--concurrency", "64", "--return-token-ids", "on", "--no-expect-reasoning", "--limit", str(a.samples),
             "--seed", "0"])
        phase("training data generated (backend.generate)", t)
        t = time.monotonic()
        base = bench(work, server.url, verifier, "bench-base", "baseline", a)
        phase("baseline benched (backend.bench)", t)
    finally:
        server.stop()
    print(base.stdout, flush=True)

    t = time.monotonic()
    summary = json.loads((work / "runs" / "gen" / "summary.json").read_text())
    rows = []
    with open(summary["token_rows"]["path"], encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            rows.append((r["input_ids"][:2048], r["loss_mask"][:2048]))
    untrained = dry_run(verifier, work / "draft-untrained", env(), layers=aux)
    drafter, losses = train(verifier, untrained, work / "draft", rows=rows, epochs=a.epochs, lr=1e-3, layers=aux,
                            device="cuda")
    phase(f"drafter trained ({len(rows)} rows, loss {losses[0]:.3f} -> {losses[-1]:.3f})", t)

    t = time.monotonic()
    server = Vllm(verifier, a.port, work / "vllm-drafter.log", drafter)
    try:
        server.wait_ready()
        log = server.log.read_text()
        if "auxiliary layers from" not in log:  # V1 runner: "Using auxiliary ...", V2: "Using Eagle3 auxiliary ..."
            print("warning: vllm did not log its auxiliary layers; is the drafter loaded?", flush=True)
        phase("drafter vllm ready", t)
        t = time.monotonic()
        drafted = bench(work, server.url, verifier, "bench-drafter", "drafter", a, "--baseline-run", "bench-base")
        phase("drafter benched (backend.bench)", t)
    finally:
        server.stop()

    result = json.loads((work / "runs" / "bench-drafter" / "summary.json").read_text())
    cmp = comparison_from_dict(result["comparison"])
    print("\n" + format_table(cmp))
    for r in cmp.rows:
        if r.ratio is not None:
            print(f"concurrency {r.concurrency}: speed-up {r.ratio:.2f}x, acceptance length "
                  f"{r.acceptance_length if r.acceptance_length is not None else float('nan'):.2f}, "
                  f"acceptance rate {r.acceptance_rate if r.acceptance_rate is not None else float('nan'):.0%}")
    total = time.monotonic() - started
    print(f"total {total:.0f} s (target {BUDGET_S} s){'  OVER BUDGET' if total > BUDGET_S else ''}; "
          f"bench exit {drafted.returncode} ({'slower' if drafted.returncode == 3 else 'not slower'})")


if __name__ == "__main__":
    main()
