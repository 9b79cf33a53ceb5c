"""Running `vllm bench serve` on the host, when it is installed there, and reading its saved result.

One invocation per concurrency level, on the same prompts (a `custom` dataset file written from the
workload: one `{"prompt": ...}` line per prompt, the last user turn, the server applying its own chat
template, so `--skip-chat-template`; `--disable-shuffle` keeps the order). Earlier turns of a
multi-turn prompt (a system prompt) do not fit vLLM's custom dataset; our own client sends them all.
Its result JSON is parsed by results.parse_vllm_bench_result.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
from typing import Sequence

from backend.bench.workload import Prompt

PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
METRIC_PERCENTILES = "50,90,99"
OUTPUT_TAIL = 4000


def find_vllm() -> str | None:
    return shutil.which("vllm")


def write_custom_dataset(prompts: Sequence[Prompt], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for p in prompts:
            last_user = next(m["content"] for m in reversed(p.messages) if m["role"] == "user")
            f.write(json.dumps({"prompt": last_user}, ensure_ascii=False) + "\n")


def bench_serve_argv(vllm: str, *, endpoint: str, model: str, tokenizer: str | None, dataset: str, num_prompts: int,
                     concurrency: int, max_tokens: int, temperature: float, top_p: float | None, seed: int,
                     result_dir: str, result_file: str, label: str, trust_remote_code: bool = False,
                     ignore_eos: bool = False) -> list[str]:
    argv = [vllm, "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
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
