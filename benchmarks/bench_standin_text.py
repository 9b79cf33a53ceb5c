"""What the stand-in's tiny-model text costs, numpy forward pass against transformers' model, in one run.

Two per-unit costs for each engine (sim/tinylm_text.py), as CPU time (process time, children included: on
a shared machine wall time mostly measures the neighbours):

- start: a fresh interpreter resolving `--text-backend tinylm` (imports, tokenizer, weights), the cost
  every stand-in start pays before it serves; the median of `--starts` interpreters per engine.
- per token: greedy decoding of `--tokens` tokens after a chat prompt, in this process, one thread.

Prints each cost and the ratio torch / numpy. The tiny verifier must be built (`python -m sim.tinylm`).

    python3 benchmarks/bench_standin_text.py [--starts 3] [--tokens 300]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ASK = [{"role": "user", "content": "Explain B-trees to a new engineer."}]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start_cost(torch: bool) -> float:
    code = (f"from sim.textbackend import resolve; r = resolve('tinylm', torch={torch}); "
            f"assert r.backend.engine == {'torch' if torch else 'numpy'!r}, r.log_line()")
    before = children_cpu()
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True,
                   env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    return children_cpu() - before


def token_cost(engine: str, tokens: int) -> tuple[float, list[int]]:
    import torch

    from sim import tinylm
    from sim.tinylm_text import Sampling, TinyText

    torch.set_num_threads(1)
    text = TinyText(tinylm.model_dir(), engine=engine)
    prompt = text.chat_prompt(ASK, thinking=True)
    made: list[int] = []
    began = time.process_time()
    while len(made) < tokens:  # EOS ends a completion early: ask again with what it said so far
        made += text._generate(prompt + made, tokens - len(made), Sampling(temperature=0))
    return (time.process_time() - began) / tokens, made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=300)
    args = ap.parse_args()
    from sim import tinylm

    if not (tinylm.model_dir() / "config.json").is_file():
        print("build the tiny verifier first: python -m sim.tinylm", file=sys.stderr)
        return 2
    starts = {engine: statistics.median(start_cost(engine == "torch") for _ in range(args.starts))
              for engine in ("numpy", "torch")}
    numpy_token, numpy_ids = token_cost("numpy", args.tokens)
    torch_token, torch_ids = token_cost("torch", args.tokens)
    print(f"start (median of {args.starts}): numpy {starts['numpy']:.2f} CPU-s, torch {starts['torch']:.2f} CPU-s, "
          f"ratio torch/numpy {starts['torch'] / starts['numpy']:.1f}")
    print(f"per token (greedy, {args.tokens} tokens): numpy {numpy_token * 1e3:.2f} CPU-ms, torch "
          f"{torch_token * 1e3:.2f} CPU-ms, ratio torch/numpy {torch_token / numpy_token:.1f}")
    print(f"same tokens from both: {numpy_ids == torch_ids}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
