"""The bench run: check the server, warm it up, measure each concurrency level, compare, finish.

Writes `<work dir>/runs/<run id>/`: manifest.json, events.jsonl (start, progress per request, finish),
`bench.json` (the BenchResult, rewritten after each level, so a restart with the same run id measures
only the levels still missing) and summary.json (the result, and with --baseline-run the comparison).
Acceptance per level comes from two /metrics scrapes around it (or from vllm bench serve's own
spec_decode_* keys when it has them); the stage never makes up a figure it did not measure. After the
levels: the reasoning/answer split pass (--split-prompts, backend/bench/phases.py), the self-test's verdict
(--self-test, backend/bench/selftest.py) and the reference line (--reference-acceptance at --reference-k);
their figures go to the summary (`phases`, `self_test`, `reference`) and the report.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import replace
from typing import Any

import aiohttp

from backend.bench import STAGE
from backend.bench import client as cl
from backend.bench import phases, selftest, vllm_cli, workload
from backend.bench.compare import Comparison, Reference, compare, format_table, load_run_result, mean_length
from backend.bench.config import BenchConfig
from backend.bench.results import (OUR_CLIENT, VLLM_BENCH, BenchResult, BenchResultError, LevelResult, figures,
                                   parse_vllm_bench_result)
from backend.bench.scrape import acceptance_between
from backend.contract.runs import Manifest, RunDir, RunDirError, write_json_atomic
from backend.kit import hostfacts
from backend.kit.lifecycle import StageFailed, StageRun, refuse

RESULT_FILE = "bench.json"
VLLM_DIR = "vllm-bench"


def identity_of(c: BenchConfig, w: workload.Workload, client: str) -> dict[str, Any]:
    return {"endpoint": c.endpoint, "model": c.model, "label": c.label, "workload": w.describe(),
            "levels": list(c.levels), "max_tokens": c.max_tokens, "temperature": c.temperature, "top_p": c.top_p,
            "seed": c.seed, "client": client, "ignore_eos": c.ignore_eos}


class BenchRun:
    def __init__(self, c: BenchConfig, w: workload.Workload, client: str, references: list[BenchResult],
                 api_key: str | None = None, vllm: list[str] | None = None):
        self.c, self.w, self.client, self.references = c, w, client, references
        self.vllm = vllm  # the words that run vLLM's CLI (vllm_cli.find_vllm), with the vllm client
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.ctx: StageRun | None = None
        self.done = self.failed = 0
        self.total = len(c.levels) * len(w.prompts)
        self.started = time.monotonic()
        self.result: BenchResult | None = None
        self.split: phases.PhaseSplit | None = None
        self.self_test: selftest.SelfTest | None = None
        self.reference = (Reference(c.reference_acceptance, c.reference_k)
                          if c.reference_acceptance is not None and c.reference_k is not None else None)

    # -- events ---------------------------------------------------------------------------------------
    def emit(self, kind: str, **data: Any) -> None:
        if self.ctx is not None:
            self.ctx.emit(kind, **data)  # backend/kit/lifecycle.py: never takes the run down

    def _progress(self, level: int) -> None:
        elapsed = max(1e-9, time.monotonic() - self.started)
        self.emit("progress", done=self.done, total=self.total, failed=self.failed, level=level,
                  rate=round(self.done / elapsed, 3))

    # -- the run --------------------------------------------------------------------------------------
    async def run(self, ctx: StageRun) -> None:
        """The body (backend/kit/lifecycle.py): a stop cancels it; the levels measured so far are kept."""
        c = self.c
        self.ctx = ctx
        run_dir = ctx.run_dir
        assert run_dir is not None
        result_path = run_dir.file(RESULT_FILE)
        result = self.result = self._resume(result_path)
        ctx.start(total=self.total)
        self.done = sum(lv.completed + lv.failed for lv in result.levels)
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                server = await self._check_server(session)
                result = self.result = replace(result, server=server)
                await self._warm_up(session)
                for level in c.levels:
                    if result.level(level) is not None:
                        continue  # measured before a restart
                    lv = await self._level(session, run_dir, level)
                    result = self.result = replace(
                        result, levels=tuple(sorted((*result.levels, lv), key=lambda x: x.concurrency)))
                    write_json_atomic(result_path, result.to_dict())
                    if lv.completed == 0:
                        raise StageFailed(f"every request failed at concurrency {level}; see the errors above")
                if c.split_prompts:
                    await self._split(session)
            if c.self_test is not None:
                self.self_test = selftest.judge(c.self_test, result.levels, c.self_test_tolerance)
                self.emit("progress", done=self.done, total=self.total, failed=self.failed,
                          self_test=self.self_test.to_dict())
                if not self.self_test.ok:
                    raise StageFailed(self.self_test.line())
        finally:
            write_json_atomic(result_path, result.to_dict())

    def _resume(self, path: str) -> BenchResult:
        fresh = BenchResult(label=self.c.label, model=self.c.model, endpoint=self.c.endpoint, client=self.client,
                            workload={**self.w.describe(), "max_tokens": self.c.max_tokens,
                                      "temperature": self.c.temperature, "top_p": self.c.top_p, "seed": self.c.seed,
                                      "ignore_eos": self.c.ignore_eos})
        if not os.path.exists(path):
            return fresh
        try:
            with open(path, encoding="utf-8") as f:
                old = BenchResult.from_dict(json.load(f))
        except (OSError, ValueError, BenchResultError):
            return fresh  # a result we cannot read is measured again, never trusted
        return replace(fresh, levels=tuple(lv for lv in old.levels if lv.concurrency in self.c.levels))

    async def _check_server(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        """The server answers and serves the model; what it says about itself goes in the result."""
        c = self.c
        deadline = time.monotonic() + c.ready_timeout_s
        last = "no answer"
        while True:
            try:
                async with session.get(f"{c.endpoint}/v1/models", headers=self.headers,
                                       timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    body = json.loads(await resp.content.read(2**20)) if resp.status == 200 else None
                    last = f"/v1/models answered HTTP {resp.status}"
                if isinstance(body, dict) and isinstance(body.get("data"), list):
                    ids = [m.get("id") for m in body["data"] if isinstance(m, dict)]
                    if c.model not in ids:
                        raise StageFailed(f"{c.endpoint} serves {', '.join(map(str, ids)) or 'no model'}, not "
                                          f"{c.model}")
                    break
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise StageFailed(f"{c.endpoint} did not answer within {c.ready_timeout_s:g} s ({last}); start the "
                                  f"server (and wait until it is ready) before benching it")
            await asyncio.sleep(1.0)
        version = None
        try:
            async with session.get(f"{c.endpoint}/version", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status == 200:
                    version = (json.loads(await resp.content.read(4096)) or {}).get("version")
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError, AttributeError):
            pass
        spec = await cl.scrape(session, c.endpoint, c.model)
        return {"version": version if isinstance(version, str) else None, "spec_decode": spec is not None}

    async def _warm_up(self, session: aiohttp.ClientSession) -> None:
        """One request first, as vllm bench serve's initial test run: a server that fails it fails the bench."""
        c = self.c
        body = cl.request_body(c.model, self.w.prompts[0], cl.Sampling(min(c.max_tokens, 16), c.temperature,
                                                                        c.top_p, c.seed), 0)
        out = await cl.send(session, f"{c.endpoint}/v1/chat/completions", body, self.headers, c.request_timeout_s)
        if not out.success:
            if c.self_test is not None and selftest.refused_on_cpu(out.error):
                raise StageFailed(selftest.UNAVAILABLE_CPU)
            raise StageFailed(f"the warm-up request failed: {out.error}")

    async def _split(self, session: aiohttp.ClientSession) -> None:
        """The reasoning/answer split pass (backend/bench/phases.py): the first prompts, one at a time."""
        c = self.c
        sampling = cl.Sampling(c.max_tokens, c.temperature, c.top_p, c.seed, c.ignore_eos)
        prompts = self.w.prompts[:c.split_prompts]
        bodies = [cl.request_body(c.model, p, sampling, i) for i, p in enumerate(prompts)]
        self.split = await phases.split(session, f"{c.endpoint}/v1/chat/completions", bodies, self.headers,
                                        c.request_timeout_s, lambda: cl.scrape(session, c.endpoint, c.model))
        self.emit("progress", done=self.done, total=self.total, failed=self.failed, phases=self.split.to_dict())

    async def _level(self, session: aiohttp.ClientSession, run_dir: RunDir, level: int) -> LevelResult:
        c = self.c
        before = await cl.scrape(session, c.endpoint, c.model)
        if self.client == VLLM_BENCH:
            lv = await self._vllm_level(run_dir, level)
        else:
            def done(outcome: Any) -> None:
                self.done += 1
                self.failed += 0 if outcome.success else 1
                if not outcome.success:
                    self.emit("error", fatal=False, message=f"request failed: {outcome.error[:300]}")
                self._progress(level)

            sampling = cl.Sampling(c.max_tokens, c.temperature, c.top_p, c.seed, c.ignore_eos)
            outcomes, wall = await cl.run_prompts(session, f"{c.endpoint}/v1/chat/completions", c.model,
                                                  self.w.prompts, sampling, level, self.headers,
                                                  c.request_timeout_s, done)
            lv = figures(outcomes, wall, level, None)
        after = await cl.scrape(session, c.endpoint, c.model)
        if lv.acceptance is None:  # ours, or a vllm bench serve older than 0.15.1
            lv = replace(lv, acceptance=acceptance_between(before, after))
        self.emit("progress", done=self.done, total=self.total, failed=self.failed, level=level,
                  level_done={"concurrency": level, "output_throughput": round(lv.output_throughput, 3),
                              "acceptance_length": round(lv.acceptance.length, 4) if lv.acceptance else None})
        return lv

    async def _vllm_level(self, run_dir: RunDir, level: int) -> LevelResult:
        c = self.c
        vllm = self.vllm
        assert vllm is not None  # choose_client found it
        out_dir = run_dir.file(VLLM_DIR)
        os.makedirs(out_dir, exist_ok=True)
        dataset = os.path.join(out_dir, "prompts.jsonl")
        vllm_cli.write_custom_dataset(self.w.prompts, dataset)
        name = f"c{level}.json"
        argv = vllm_cli.bench_serve_argv(vllm, endpoint=c.endpoint, model=c.model, tokenizer=c.tokenizer,
                                         dataset=dataset, num_prompts=len(self.w.prompts), concurrency=level,
                                         max_tokens=c.max_tokens, temperature=c.temperature, top_p=c.top_p,
                                         seed=c.seed, result_dir=out_dir, result_file=name, label=c.label,
                                         trust_remote_code=c.trust_remote_code, ignore_eos=c.ignore_eos)
        self.emit("progress", done=self.done, total=self.total, failed=self.failed, level=level,
                  command=vllm_cli.shown(argv))
        env = {"OPENAI_API_KEY": self.headers["Authorization"][7:]} if "Authorization" in self.headers else None
        rc, tail = await vllm_cli.run(argv, c.request_timeout_s * max(1, len(self.w.prompts)), env)
        path = os.path.join(out_dir, name)
        if rc != 0 or not os.path.exists(path):
            raise StageFailed(f"vllm bench serve exited {rc} at concurrency {level}: {tail[-1500:]}")
        try:
            with open(path, encoding="utf-8") as f:
                lv = parse_vllm_bench_result(json.load(f), level)
        except (OSError, ValueError, BenchResultError) as exc:
            raise StageFailed(f"cannot read vllm bench serve's result {path}: {exc}") from None
        self.done += lv.completed + lv.failed
        self.failed += lv.failed
        return lv

    # -- the end --------------------------------------------------------------------------------------
    def summarize(self, status: str, error: str | None) -> dict[str, Any]:
        assert self.ctx is not None and self.result is not None
        result = self.result
        comparison: Comparison | None = None
        if status == "completed" and self.references:
            comparison = compare([self.references[0], result, *self.references[1:]], self.references[0].label)
        if status == "stopped":
            error = "stopped by a signal before every level was measured"
        summary: dict[str, Any] = {
            "stage": STAGE, "run_id": self.c.run_id, "status": status, "label": self.c.label,
            "done": self.done, "total": self.total, "failed": self.failed, "client": self.client,
            "outputs": {"results": self.ctx.file(RESULT_FILE)}, "result": result.to_dict(),
            "elapsed_s": round(time.monotonic() - self.started, 3),
        }
        self.comparison = comparison
        if comparison is not None:
            summary["comparison"] = comparison.to_dict()
            summary["slower"] = comparison.slower
        if self.split is not None:
            summary["phases"] = self.split.to_dict()
        if self.self_test is not None:
            summary["self_test"] = self.self_test.to_dict()
        if self.reference is not None:
            length, k = self._measured(comparison)
            summary["reference"] = {"length": self.reference.length, "k": self.reference.k, "label": self.c.label,
                                    "measured": None if length is None else round(length, 4), "measured_k": k}
        if error:
            summary["error"] = error
        return summary

    def _measured(self, comparison: Comparison | None) -> tuple[float | None, int | None]:
        """This server's mean acceptance length over its levels, and the K it drafted at."""
        assert self.result is not None
        length = (mean_length(comparison, self.result.label) if comparison is not None
                  else _mean([lv.acceptance.length for lv in self.result.levels if lv.acceptance]))
        return length, measured_k(self.result)

    def report(self, summary: dict[str, Any]) -> str:
        assert self.result is not None
        comparison = getattr(self, "comparison", None)
        lines = [format_table(comparison) if comparison is not None else _levels_text(self.result)]
        if self.reference is not None:
            lines.append(self.reference.line(self.result.label, *self._measured(comparison)))
        if self.split is not None:
            lines.extend(self.split.lines())
        if self.self_test is not None:
            lines.append(self.self_test.line())
        return "\n".join(lines)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def measured_k(result: BenchResult) -> int | None:
    """The K the server drafted at: vLLM's per-position counters have one position per draft token."""
    ks = {len(lv.acceptance.per_position) for lv in result.levels if lv.acceptance and lv.acceptance.per_position}
    return ks.pop() if len(ks) == 1 else None


def _levels_text(result: BenchResult) -> str:
    lines = [f"{result.label}: {result.model} at {result.endpoint} ({result.client})"]
    for lv in result.levels:
        acc = (f", acceptance length {lv.acceptance.length:.2f} ({lv.acceptance.rate:.0%} of drafts)"
               if lv.acceptance and lv.acceptance.rate is not None else "")
        lines.append(f"  concurrency {lv.concurrency}: {lv.output_throughput:.1f} out tok/s, "
                     f"{lv.request_throughput:.2f} req/s, TPOT p50 {lv.stat('tpot', 'median') or 0:.1f} ms, "
                     f"TTFT p50 {lv.stat('ttft', 'median') or 0:.1f} ms, failed {lv.failed}{acc}")
    return "\n".join(lines)


def choose_client(c: BenchConfig) -> tuple[str, list[str] | None]:
    """The client, and for `vllm bench serve` the words that run vLLM's CLI."""
    if c.client == "ours":
        return OUR_CLIENT, None
    found = vllm_cli.find_vllm(c.vllm_python)
    if c.client == "vllm" and not found:
        where = f"{c.vllm_python} cannot import vllm and " if c.vllm_python else ""
        raise RunDirError(f"--client vllm: {where}`vllm` is not on this host's PATH (install vLLM, or use "
                          f"--client ours)")
    return (VLLM_BENCH, found) if found else (OUR_CLIENT, None)


def with_output_length(c: BenchConfig, w: workload.Workload) -> BenchConfig:
    """--max-tokens, defaulting to the workload's own median completion length (workload.py)."""
    if c.max_tokens is not None:
        return c
    if w.median_completion is None:
        raise RunDirError(f"--max-tokens: the prompts ({w.source}) carry no completion lengths to take the "
                          f"workload's median from: give --max-tokens")
    return replace(c, max_tokens=w.median_completion)


def main(c: BenchConfig, api_key: str | None = None) -> int:
    """Everything that can be refused is refused before the run directory is touched (exit 2).
    `api_key`: read from --api-key-file by __main__ before anything else (the file may be gone by now)."""
    try:
        client, vllm = choose_client(c)
        if c.input_run:
            w = workload.from_run(c.work_dir, c.input_run, c.num_prompts, c.seed)
        else:
            w = workload.from_file(str(c.prompts), c.num_prompts, c.seed)
        c = with_output_length(c, w)
        refs = [load_run_result(c.work_dir, r) for r in (c.baseline_run, c.third_run) if r]
        labels = [r.label for r in refs] + [c.label]
        if len(set(labels)) != len(labels):
            raise RunDirError(f"--label {c.label!r} is already the label of a run it is compared with; give each "
                              f"contender its own label")
        manifest = Manifest(stage=STAGE, run_id=c.run_id, identity=identity_of(c, w, client),
                            settings={"request_timeout_s": c.request_timeout_s, "baseline_run": c.baseline_run,
                                      "third_run": c.third_run})
    except RunDirError as exc:
        return refuse("bench", exc)
    run = BenchRun(c, w, client, refs, api_key, vllm)
    ctx = StageRun(STAGE, c.run_id, work_dir=c.work_dir, manifest=manifest, fresh=c.fresh, mode="cancel")
    # provenance: the benched server's command line as it runs (the listener's own), else as its starter says
    ctx.server_command = hostfacts.serving_command(c.endpoint) or list(c.server_command) or None
    ctx.summarize = run.summarize
    ctx.report = run.report
    ctx.stop_note = "ending the bench; the levels measured so far are kept"
    return asyncio.run(ctx.arun(run.run))
