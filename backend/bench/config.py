"""The bench stage's command line, checked before anything is touched (bad input: exit 2, nothing made)."""
from __future__ import annotations

import argparse
import json
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
    remove_api_key_file: bool = False  # a lone bench's own copy (the console's, on the host): removed once read
    baseline_run: str | None = None
    third_run: str | None = None
    fresh: bool = False
    self_test: float | None = None  # the acceptance length the server was set to (backend/bench/selftest.py)
    self_test_tolerance: float = 0.05
    reference_acceptance: float | None = None  # the field's figure, at reference_k (compare.Reference)
    reference_k: int | None = None
    split_prompts: int = 0  # requests of the reasoning/answer split pass (backend/bench/phases.py); 0: none
    server_command: tuple[str, ...] = ()  # the benched server's command line as its starter knows it (provenance)


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
    a("--api-key-file", help="the file holding the server's API key (--api-key)")
    a("--remove-api-key-file", action="store_true",
      help="remove --api-key-file as soon as it is read, whatever the run does next (a lone bench's own copy; "
           "the bench pair's benches share one, which the pair removes at its end)")
    a("--baseline-run", help="a finished bench run to compare with (exit 3 when this one is slower)")
    a("--third-run", help="a third finished bench run in the comparison (e.g. a published drafter)")
    a("--fresh", action="store_true", help="archive an existing run directory of this id and start over")
    a("--self-test", type=float, metavar="LENGTH", help="the server runs vLLM's synthetic sampler set to this "
      "acceptance length: the bench must read it back (within --self-test-tolerance) or fail")
    a("--self-test-tolerance", type=float, default=0.05, help="absolute, in acceptance length (default 0.05)")
    a("--reference-acceptance", type=float, help="the field's acceptance length for this model (with "
      "--reference-k): shown next to the measured one")
    a("--reference-k", type=int, help="the K the reference acceptance was measured at")
    a("--split-prompts", type=int, default=0, metavar="N", help="after the levels, N requests one at a time "
      "whose acceptance is split between reasoning and answer (0: no split pass)")
    a("--server-command", default="", help="the benched server's command line, a JSON list (recorded in the "
      "run's host facts when the listening process's own is not visible to this user)")
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
    if ns.remove_api_key_file and not ns.api_key_file:
        raise ConfigError("--remove-api-key-file needs --api-key-file (the file to remove once read)")
    if ns.third_run and not ns.baseline_run:
        raise ConfigError("--third-run needs --baseline-run (the comparison's reference)")
    if ns.self_test is not None:
        from backend.bench.selftest import check_length

        if why := check_length(ns.self_test):
            raise ConfigError(f"--self-test {ns.self_test}: {why}")
        if not 0 < ns.self_test_tolerance <= 1:
            raise ConfigError(f"--self-test-tolerance {ns.self_test_tolerance}: expected (0, 1]")
    if (ns.reference_acceptance is None) != (ns.reference_k is None):
        raise ConfigError("--reference-acceptance and --reference-k go together (a length means something only at "
                          "its K)")
    if ns.reference_k is not None:
        from backend.bench.compare import check_reference

        if why := check_reference(ns.reference_acceptance, ns.reference_k):
            key, _, msg = why.partition(": ")
            raise ConfigError(f"--{key.replace('_', '-')} {getattr(ns, key)}: {msg}")
    if not 0 <= ns.split_prompts <= 1000:
        raise ConfigError(f"--split-prompts {ns.split_prompts}: expected 0..1000")
    try:
        command = json.loads(ns.server_command) if ns.server_command else []
    except ValueError:
        command = None
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise ConfigError(f"--server-command {ns.server_command[:80]!r}: expected a JSON list of strings")
    if ns.vllm_python is not None and not PYTHON.fullmatch(ns.vllm_python):
        raise ConfigError(f"--vllm-python {ns.vllm_python!r}: expected a path to an interpreter")
    return BenchConfig(work_dir=ns.work_dir, run_id=ns.run_id, endpoint=ns.endpoint.rstrip("/"), model=ns.model,
                       label=ns.label, levels=_levels(ns.concurrency), num_prompts=ns.num_prompts,
                       max_tokens=ns.max_tokens, temperature=ns.temperature, top_p=ns.top_p, seed=ns.seed,
                       client=ns.client, prompts=ns.prompts, input_run=ns.input_run, tokenizer=ns.tokenizer,
                       vllm_python=ns.vllm_python, trust_remote_code=ns.trust_remote_code,
                       ignore_eos=ns.ignore_eos,
                       request_timeout_s=ns.request_timeout, ready_timeout_s=ns.ready_timeout,
                       api_key_file=ns.api_key_file, remove_api_key_file=ns.remove_api_key_file,
                       baseline_run=ns.baseline_run, third_run=ns.third_run,
                       fresh=ns.fresh, self_test=ns.self_test, self_test_tolerance=ns.self_test_tolerance,
                       reference_acceptance=ns.reference_acceptance, reference_k=ns.reference_k,
                       split_prompts=ns.split_prompts, server_command=tuple(command))
