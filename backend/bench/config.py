"""The bench stage's command line, checked before anything is touched (bad input: exit 2, nothing made)."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from backend.kit.lifecycle import ConfigError  # noqa: F401 - the one definition, raised here

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
CLIENTS = ("auto", "vllm", "ours")
PYTHON = re.compile(r"[A-Za-z0-9_./+~-]{1,4096}")
MAX_LEVELS = 16


@dataclass(frozen=True)
class BenchConfig:
    work_dir: str
    run_id: str
    endpoint: str
    model: str
    label: str
    levels: tuple[int, ...]
    num_prompts: int
    max_tokens: int | None  # None: the median completion length of the workload's records (workload.py)
    temperature: float
    top_p: float | None
    seed: int
    client: str
    prompts: str | None = None
    input_run: str | None = None
    tokenizer: str | None = None
    vllm_python: str | None = None  # the served vLLM's interpreter: `vllm bench serve` through it
    trust_remote_code: bool = False
    ignore_eos: bool = False
    request_timeout_s: float = 600.0
    ready_timeout_s: float = 60.0
    api_key_file: str | None = None
    baseline_run: str | None = None
    third_run: str | None = None
    fresh: bool = False


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--concurrency {text!r}: expected comma-separated integers such as 1,4,16") from None
    if not levels or any(c < 1 or c > 4096 for c in levels) or len(set(levels)) != len(levels):
        raise ConfigError(f"--concurrency {text!r}: expected distinct levels from 1 to 4096")
    if len(levels) > MAX_LEVELS:
        raise ConfigError(f"--concurrency: at most {MAX_LEVELS} levels")
    return tuple(sorted(levels))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m backend.bench",
                                description="Bench a vLLM server on held-out prompts at fixed concurrency levels.")
    a = p.add_argument
    a("--work-dir", required=True)
    a("--run-id", required=True)
    a("--endpoint", required=True, help="the server, e.g. http://127.0.0.1:8000")
    a("--model", required=True, help="the served model id the requests name")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help="a JSONL/parquet/json file of generation records or chat rows")
    src.add_argument("--input-run", help="a completed prepare run (its held-out rows) or generate run")
    a("--label", default="baseline", help="this server's name in the comparison: baseline, drafter, ...")
    a("--concurrency", default="1,4", help="comma-separated concurrency levels (default 1,4)")
    a("--num-prompts", type=int, default=32)
    a("--max-tokens", type=int, default=None, help="output length per request (max_completion_tokens); default: "
      "the median completion length of the selected prompts' generation records")
    a("--temperature", type=float, default=0.0)
    a("--top-p", type=float)
    a("--seed", type=int, default=0, help="selects the prompts; request i samples with seed + i")
    a("--client", choices=CLIENTS, default="auto", help="vllm: `vllm bench serve`; ours: the built-in client; "
      "auto: vllm when installed on this host")
    a("--tokenizer", help="vllm bench serve: the checkpoint to count tokens with (default: --model)")
    a("--vllm-python", help="the served vLLM's python: `vllm bench serve` runs through it (vLLM's CPU build's "
      "`vllm` script does not run); default `vllm` on PATH")
    a("--trust-remote-code", action="store_true")
    a("--ignore-eos", action="store_true", help="every request generates exactly --max-tokens")
    a("--request-timeout", type=float, default=600.0)
    a("--ready-timeout", type=float, default=60.0, help="how long to wait for the server to answer")
    a("--api-key-file")
    a("--baseline-run", help="a finished bench run to compare with (exit 3 when this one is slower)")
    a("--third-run", help="a third finished bench run in the comparison (e.g. a published drafter)")
    a("--fresh", action="store_true", help="archive an existing run directory of this id and start over")
    return p


def parse_config(argv: list[str] | None = None) -> BenchConfig:
    ns = build_parser().parse_args(argv)
    if not LABEL.fullmatch(ns.label):
        raise ConfigError(f"--label {ns.label!r}: letters, digits, '_', '.', '-' (at most 40), starting with a "
                          f"letter or digit")
    if not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+(:\d{1,5})?", ns.endpoint.rstrip("/")):
        raise ConfigError(f"--endpoint {ns.endpoint!r}: expected http://HOST:PORT")
    for name, value, lo, hi in (("--num-prompts", ns.num_prompts, 1, 1_000_000),
                                ("--max-tokens", ns.max_tokens, 1, 10_000_000)):
        if value is not None and not lo <= value <= hi:
            raise ConfigError(f"{name} {value}: expected {lo}..{hi}")
    if not 0 <= ns.temperature <= 5:
        raise ConfigError(f"--temperature {ns.temperature}: expected 0..5")
    if ns.top_p is not None and not 0 < ns.top_p <= 1:
        raise ConfigError(f"--top-p {ns.top_p}: expected (0, 1]")
    if ns.request_timeout <= 0 or ns.ready_timeout <= 0:
        raise ConfigError("--request-timeout and --ready-timeout must be > 0")
    if ns.third_run and not ns.baseline_run:
        raise ConfigError("--third-run needs --baseline-run (the comparison's reference)")
    if ns.vllm_python is not None and not PYTHON.fullmatch(ns.vllm_python):
        raise ConfigError(f"--vllm-python {ns.vllm_python!r}: expected a path to an interpreter")
    return BenchConfig(work_dir=ns.work_dir, run_id=ns.run_id, endpoint=ns.endpoint.rstrip("/"), model=ns.model,
                       label=ns.label, levels=_levels(ns.concurrency), num_prompts=ns.num_prompts,
                       max_tokens=ns.max_tokens, temperature=ns.temperature, top_p=ns.top_p, seed=ns.seed,
                       client=ns.client, prompts=ns.prompts, input_run=ns.input_run, tokenizer=ns.tokenizer,
                       vllm_python=ns.vllm_python, trust_remote_code=ns.trust_remote_code,
                       ignore_eos=ns.ignore_eos,
                       request_timeout_s=ns.request_timeout, ready_timeout_s=ns.ready_timeout,
                       api_key_file=ns.api_key_file, baseline_run=ns.baseline_run, third_run=ns.third_run,
                       fresh=ns.fresh)
