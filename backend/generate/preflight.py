"""Checks before the first request (also alone: `--preflight-only` prints them as JSON).

Each failed check carries `fix`: the exact thing the operator should do. A shallow check is not
enough (the wrong model can be served, or generation can fail while /v1/models answers), so the
preflight also sends one small completion and looks at what comes back.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from backend.kit import preflight as shared
from backend.kit.hostfacts import check_host
from backend.kit.preflight import Check, PreflightReport, free_bytes, human_bytes  # noqa: F401 - the shared kit

from backend.generate.client import ChatClient
from backend.generate.config import GenerateConfig
from backend.generate.fit import ContextLimits, discover
from backend.generate.records import ResponseError, dumps_line, loads, parse_completion
from backend.kit.dataset import DatasetError, data_files

REQUIRED_MODULES = ("aiohttp", "datasets", "pyarrow")
# .jsonl is read line by line with json; only parquet and .json go through `datasets` (and pyarrow), so a
# host (the demo's, for one) with a jsonl dataset needs neither
JSONL_MODULES = ("aiohttp",)
SMOKE_PROMPT = "Reply with one short sentence: what is 2 + 2?"
# Bytes a record takes per generated token: the text once (~4.2 B/token, rounded up); token ids ~7 B/token,
# twice counting the pre-tokenized export. Answers average well under max_tokens, but a reasoning model
# runs long: plan for answers half the budget long, which still leaves room for a run that goes long.
TEXT_BYTES_PER_TOKEN = 5
IDS_BYTES_PER_TOKEN = 14
EXPECTED_FILL = 0.5


@dataclass
class GenerationPreflight(PreflightReport):
    """The shared report (backend/kit/preflight.py) with what the generation's checks found about the server."""
    token_ids: bool | None = None  # whether the server returned token ids in the smoke completion
    context: ContextLimits | None = None  # the served context and whether /tokenize answers
    max_model_len: int | None = None  # from the served model's card in /v1/models

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "token_ids": self.token_ids, "warnings": self.warnings(),
                "context": self.context.to_dict() if self.context is not None else None,
                "checks": [asdict(c) for c in self.checks]}


def modules_for(dataset: str) -> tuple[str, ...]:
    try:
        names = data_files(dataset)
    except DatasetError:
        return REQUIRED_MODULES
    return JSONL_MODULES if all(n.endswith(".jsonl") for n in names) else REQUIRED_MODULES


def check_modules(report: PreflightReport, modules: tuple[str, ...] = REQUIRED_MODULES) -> None:
    shared.check_modules(report, modules)


def estimate_bytes(samples: int, max_tokens: int, token_ids: bool, avg_row_bytes: int) -> int:
    tokens = max_tokens * EXPECTED_FILL
    per = int(tokens * (TEXT_BYTES_PER_TOKEN + (IDS_BYTES_PER_TOKEN if token_ids else 0))) + 2 * avg_row_bytes
    return samples * per


def check_disk(report: PreflightReport, run_dir: str, need: int) -> None:
    shared.check_disk(report, run_dir, need, what="the output (answers averaging half of max_tokens)",
                      fix="point --work-dir at a larger volume, or lower --limit/--max-tokens",
                      work_dir=os.path.dirname(os.path.dirname(os.path.abspath(run_dir))))


def check_context(report: PreflightReport, limits: ContextLimits, config: GenerateConfig) -> None:
    """How prompts will be fitted; fails only when no prompt at all could be sent."""
    limit = limits.max_model_len
    how = (f"prompt lengths measured with /tokenize (a one-turn prompt takes {limits.probe_tokens} tokens)"
           if limits.tokenize else f"{limits.note}; too-long prompts are found from the server's 400 answers")
    if limit is None:
        report.add("prompt_fit", True, f"the server does not say its max_model_len; {how}")
        return
    if config.max_tokens >= limit and config.long_prompt == "skip":
        report.add("prompt_fit", False, f"--max-tokens {config.max_tokens} leaves no room for a prompt in the "
                   f"served context of {limit} tokens, and --long-prompt skip would skip every sample",
                   f"lower --max-tokens well below {limit}, or pass --long-prompt reduce")
        return
    note = (f"; --max-tokens {config.max_tokens} >= max_model_len: every prompt gets a reduced budget"
            if config.max_tokens >= limit else "")
    report.add("prompt_fit", True, f"max_model_len {limit}; {how}; a prompt that fits only with a smaller "
               f"max_tokens is {'sent with a reduced max_tokens' if config.long_prompt == 'reduce' else 'skipped'}"
               f"{note}")


async def check_server(report: GenerationPreflight, client: ChatClient, config: GenerateConfig) -> None:
    url = config.endpoint
    status = await client.health()
    if status != 200:
        report.add("server_ready", False,
                   f"nothing answers at {url}/health" if status is None else f"{url}/health returned {status}",
                   "start the server (or wait: while vLLM loads its port refuses connections), then "
                   "rerun; check the server unit's log" if status is None else
                   "the engine is not healthy (503 = it died): read the server log and restart it")
        return
    report.add("server_ready", True, f"{url}/health answered 200")
    try:
        code, body = await client.get_json("/v1/models")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        report.add("served_model", False, f"GET /v1/models failed: {exc}", "check the server log")
        return
    if code == 401:
        report.add("served_model", False, "GET /v1/models returned 401 (the server wants an API key)",
                   "pass --api-key-env VAR or --api-key-file FILE with the server's --api-key")
        return
    ids = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)] if isinstance(body, dict) else []
    if config.model not in ids:
        report.add("served_model", False, f"the server serves {ids or 'nothing'}, not {config.model!r}",
                   f"pass --model {ids[0]}" if len(ids) == 1 else
                   "pass --model with the served id, or restart the server with --served-model-name")
        return
    report.add("served_model", True, f"serves {config.model!r}")
    card = next(m for m in body["data"] if isinstance(m, dict) and m.get("id") == config.model)
    limit = card.get("max_model_len")
    report.max_model_len = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
    await _smoke(report, client, config)


async def _smoke(report: GenerationPreflight, client: ChatClient, config: GenerateConfig) -> None:
    payload: dict[str, Any] = {**config.sampling_params(), "model": config.model,
                               "messages": [{"role": "user", "content": SMOKE_PROMPT}],
                               "max_tokens": min(config.max_tokens, 256)}
    if config.chat_template_kwargs:
        payload["chat_template_kwargs"] = config.chat_template_kwargs
    if config.return_token_ids != "off":
        payload["return_token_ids"] = True
    try:
        status, body = await client.post_once(dumps_line(payload), timeout=min(config.request_timeout, 300))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        report.add("smoke_completion", False, f"the test completion failed: {type(exc).__name__}: {exc}",
                   "check the server log; the engine may be overloaded or dead")
        return
    if status != 200:
        report.add("smoke_completion", False, f"the test completion returned HTTP {status}: "
                   f"{body[:200].decode(errors='replace')}", "fix the request settings named in the error "
                   "(sampling, chat_template_kwargs) or the server")
        return
    try:
        done = parse_completion(loads(body))
    except (ResponseError, ValueError) as exc:
        report.add("smoke_completion", False, f"the test completion is malformed: {exc}",
                   "check that --endpoint points at a vLLM OpenAI-compatible server")
        return
    report.token_ids = bool(done.token_ids)
    if config.expect_reasoning and not done.reasoning:
        report.add("smoke_completion", False, "the test completion came back without reasoning",
                   "start vLLM with --reasoning-parser (kimi_k2 for Kimi-K2.5), turn thinking on with "
                   "--chat-template-kwargs '{\"thinking\": true}', or pass --no-expect-reasoning")
        return
    if config.return_token_ids == "on" and not done.token_ids:
        report.add("smoke_completion", False, "the server ignored return_token_ids",
                   "use a vLLM that supports return_token_ids, or pass --return-token-ids auto")
        return
    report.add("smoke_completion", True,
               f"answered ({done.finish_reason}); reasoning {len(done.reasoning or '')} chars; token ids "
               f"{'returned' if done.token_ids else 'not returned'}")


async def run_preflight(config: GenerateConfig, client: ChatClient, *, run_dir: str, samples: int,
                        avg_row_bytes: int) -> GenerationPreflight:
    report = GenerationPreflight()
    check_modules(report, modules_for(config.dataset))
    check_host(report, config.nvidia_smi)  # warnings: two vLLM installs, an old driver
    await check_server(report, client, config)
    if any(c.name == "served_model" and c.ok for c in report.checks):  # the server is up and serves it
        report.context = await discover(client, config.model, config.chat_template_kwargs,
                                        max_model_len=report.max_model_len)
        check_context(report, report.context, config)
    token_ids = bool(report.token_ids) if config.return_token_ids == "auto" else config.return_token_ids == "on"
    check_disk(report, run_dir, estimate_bytes(samples, config.max_tokens, token_ids, avg_row_bytes))
    return report
