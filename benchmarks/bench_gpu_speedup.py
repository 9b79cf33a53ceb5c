"""On a machine with one GPU: the pipeline's own stages end to end on a small verifier, through real vLLM and
speculators, driven as an operator drives them: the console's commands on a local host profile.
Not part of the CPU test suite.

    python benchmarks/bench_gpu_speedup.py [--work DIR] [--port 8123] [--samples 256] [--prompts 64]
                                           [--max-tokens 256] [--concurrency 1,8] [--layers 12] [--hidden 1024]
    python benchmarks/bench_gpu_speedup.py --plan-only   # write the profile, print the steps, run nothing

Needs, on that machine: a CUDA torch, a stock `pip install vllm speculators` (vLLM at least the `serve`
extra's floor, see pyproject.toml), this project installed with its `host` extra, tmux; nothing is
downloaded and nothing from tests/ is imported. Target: under 10 minutes on one GPU.

1. Verifier (~140M parameters by default): the tiny verifier's tokenizer and chat template
   (sim/tinylm.py, built locally on first use), a wider and deeper Llama trained for a minute on the GPU
   on the same generated chat turns, saved as an ordinary Hugging Face directory.
2. A local host profile (transport local, tmux manager; [server].command is `vllm serve` of the verifier)
   written with the project's own schema, then the console's commands, each step timed:
   `start-server` + `wait-ready`; `run generate --wait` (token ids on) on the training prompts;
   `run prepare --wait`; `run extract --yes --wait`: the stage swaps the baseline for the extraction server
   (the same command line plus vLLM's `extract_hidden_states` speculative method and its hidden-states KV
   connector) and back; `stop-server` (training needs the one GPU the server holds); `run train --wait`
   (speculators, on GPU 0); `run verify --wait`; `start-server` + `wait-ready`; `run bench --yes --wait`:
   the baseline benched, swapped for the drafter server (eagle3, the verified checkpoint), benched on the
   same held-out prompts, compared, swapped back.

Prints each phase's wall time, the comparison table (exit 3 from the bench: the drafter was slower) and per
level the speed-up and acceptance length. Written without a GPU to run it on: the CPU tests check that it
imports without pytest and that the profile it writes loads; the vLLM runs and the timing are unverified.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.bench.compare import comparison_from_dict, format_table  # noqa: E402
from console.profile import load_profile, profile_from_dict, write_profile  # noqa: E402
from sim import tinycorpus, tinylm  # noqa: E402

MODEL = "gpu-tiny"
K = 3
BUDGET_S = 600
BENCH_RUN = "bench-gpu"
TIMES: dict[str, float] = {}


def phase(name: str, started: float) -> None:
    TIMES[name] = time.monotonic() - started
    print(f"[{sum(TIMES.values()):6.0f} s] {name}: {TIMES[name]:.1f} s", flush=True)


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


# ---- 2. the profile and the console's commands ----------------------------------------------------------
def aux_layers(layers: int) -> list[int]:
    """vLLM's default ids (2, n//2, n-3), distinct from 6 layers on."""
    return [2, layers // 2, layers - 3]


def profile_data(a: argparse.Namespace, work: Path, verifier: Path) -> dict:
    host_dir = work / "host"
    serve = ["vllm", "serve", str(verifier), "--served-model-name", MODEL, "--host", "127.0.0.1",
             "--port", str(a.port), "--max-model-len", "4096", "--gpu-memory-utilization", "0.5", "--seed", "0"]
    return {
        "host": {"name": "localhost", "transport": "local"},
        "server": {"manager": "tmux", "unit": "e3-gpu-bench-vllm", "model_path": str(verifier),
                   "served_model_name": MODEL, "port": a.port, "command": serve, "expect_reasoning": False,
                   "load_timeout_s": 600.0, "stop_timeout_s": 60.0},
        "paths": {"work_dir": str(host_dir), "data_dir": str(work), "python": sys.executable},
        "gpus": {"count": 1},
        "generate": {"dataset": str(work / "train.jsonl"), "samples": a.samples, "concurrency": 64,
                     "max_tokens": 512, "request_timeout_s": 300.0, "temperature": 0.7,
                     "return_token_ids": "on"},
        "drafter": {"verifier": str(verifier), "aux_layer_ids": aux_layers(a.layers), "num_speculative_tokens": K},
        "prepare": {"seq_length": 2048, "heldout_fraction": 0.05, "heldout_min": 4},
        "extract": {"online": False, "concurrency": 16, "reserve_gib": 1.0, "ready_timeout_s": 600.0},
        "train": {"epochs": a.epochs, "learning_rate": 1e-3, "optimizer": "adamw", "seq_length": 2048, "gpus": 1},
        "verify": {"samples": 32},
        "serve_drafter": {"draft_tensor_parallel_size": 1},
        "bench": {"dataset": str(work / "heldout.jsonl"), "num_prompts": a.prompts,
                  "concurrency": [int(c) for c in a.concurrency.split(",")], "max_tokens": a.max_tokens,
                  "temperature": 0.0, "client": "auto"},
    }


def write_bench_profile(a: argparse.Namespace, work: Path, verifier: Path) -> Path:
    path = work / "profile.toml"
    write_profile(profile_from_dict(profile_data(a, work, verifier), file=str(path)), path, overwrite=True)
    load_profile(path)  # what the console will read
    return path


def steps(profile: Path) -> list[tuple[str, list[str], tuple[int, ...]]]:
    """(what, the console command, exit statuses that are not a failure), in order."""
    p = ["--profile", str(profile)]
    ready = ["wait-ready", *p, "--timeout", "600"]
    return [
        ("baseline server started", ["start-server", *p, "--yes"], (0,)),
        ("baseline ready", ready, (0,)),
        ("generate (token ids)", ["run", "generate", *p, "--run-id", "gen", "--wait"], (0,)),
        ("prepare", ["run", "prepare", *p, "--run-id", "prep", "--wait"], (0,)),
        ("extract (vLLM extract_hidden_states, swapped in and out)",
         ["run", "extract", *p, "--run-id", "ext", "--no-online", "--yes", "--wait"], (0,)),
        ("baseline stopped for training", ["stop-server", *p, "--yes"], (0,)),
        ("train (speculators, GPU 0)", ["run", "train", *p, "--run-id", "train", "--no-online", "--wait"], (0,)),
        ("verify", ["run", "verify", *p, "--run-id", "verify", "--no-online", "--wait"], (0,)),
        ("baseline server started again", ["start-server", *p, "--yes"], (0,)),
        ("baseline ready again", ready, (0,)),
        ("bench (baseline, drafter server, compared)", ["run", "bench", *p, "--run-id", BENCH_RUN, "--yes", "--wait"],
         (0, 3)),
    ]


def console(argv: list[str], ok: tuple[int, ...], timeout: float = 1200) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "console.cli", *argv]
    print("  $ eagle3-console " + " ".join(argv), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    if proc.returncode not in ok:
        raise SystemExit(f"eagle3-console {' '.join(argv[:2])} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n"
                         f"{proc.stderr[-4000:]}")
    return proc


def write_prompts(work: Path, samples: int, prompts: int) -> None:
    """The demo's questions and the corpus' others, split once: training vs held out for the bench."""
    questions = tinycorpus.demo_questions(samples + prompts)
    for name, qs in (("train.jsonl", questions[:samples]), ("heldout.jsonl", questions[samples:])):
        (work / name).write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n"
                                         for q in qs))


def report(work: Path, bench: subprocess.CompletedProcess, started: float) -> None:
    print(bench.stdout, flush=True)
    summary = work / "host" / "runs" / f"{BENCH_RUN}-drafter" / "summary.json"
    if summary.exists():
        result = json.loads(summary.read_text())
        if isinstance(result.get("comparison"), dict):
            cmp = comparison_from_dict(result["comparison"])
            print("\n" + format_table(cmp))
            for r in cmp.rows:
                if r.ratio is not None:
                    al, ar = r.acceptance_length, r.acceptance_rate
                    print(f"concurrency {r.concurrency}: speed-up {r.ratio:.2f}x, acceptance length "
                          f"{al if al is not None else float('nan'):.2f}, acceptance rate "
                          f"{ar if ar is not None else float('nan'):.0%}")
    total = time.monotonic() - started
    print(f"total {total:.0f} s (target {BUDGET_S} s){'  OVER BUDGET' if total > BUDGET_S else ''}; "
          f"bench exit {bench.returncode} ({'slower' if bench.returncode == 3 else 'not slower'})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
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
    p.add_argument("--plan-only", action="store_true",
                   help="write the profile (verifier not built) and print the console's steps; no GPU needed")
    a = p.parse_args(argv)
    if a.layers < 6:
        p.error("--layers must be at least 6 (vLLM's default aux layers (2, n//2, n-3) must be distinct)")
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    work = Path(a.work)
    if a.plan_only:
        work.mkdir(parents=True, exist_ok=True)
        write_prompts(work, a.samples, a.prompts)
        profile = write_bench_profile(a, work, work / "verifier")
        print(f"profile: {profile}")
        for what, argv_, _ in steps(profile):
            print(f"{what}: eagle3-console {' '.join(argv_)}")
        return
    import torch

    missing = [n for n in ("vllm", "tmux") if shutil.which(n) is None]
    missing += [n for n in ("speculators",) if importlib.util.find_spec(n) is None]
    if not torch.cuda.is_available() or missing:
        raise SystemExit(f"needs a CUDA GPU, and {', '.join(missing) or 'nothing else'} is missing (vllm and tmux "
                         f"on PATH, speculators importable; --plan-only runs anywhere)")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    started = time.monotonic()
    t = time.monotonic()
    verifier = build_verifier(work / "verifier", a.layers, a.hidden, a.verifier_steps, 2000)
    phase("verifier built", t)
    write_prompts(work, a.samples, a.prompts)
    profile = write_bench_profile(a, work, verifier)
    try:
        for what, argv_, ok in steps(profile):
            t = time.monotonic()
            bench = console(argv_, ok)
            phase(what, t)
        report(work, bench, started)
    finally:  # also after a failure midway: the GPU is left free
        subprocess.run([sys.executable, "-m", "console.cli", "stop-server", "--profile", str(profile), "--yes"],
                       cwd=ROOT, capture_output=True, timeout=300)


if __name__ == "__main__":
    main()
