"""The generation run: dataset -> bounded queue -> `concurrency` workers -> durable output.

Memory stays flat whatever the sample count: the producer feeds a queue of 2 x concurrency items
and a fixed pool of workers drains it (no task per sample). Counters that reach the summary are
booked only once a record is fsynced, and every durable batch is reported in a progress event, so a
crash never reports work that is not on disk and a killed run's last event says what is.

Every event counts `total` the same way: the dataset rows in scope (`--limit`). Of those, `done` have a
record, `skipped` were left out for a counted reason (a bad row, a prompt that does not fit the context)
and `failed` were tried and failed, by reason; `failed_permanent` of them can never succeed as they are.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from backend.contract import exitcodes
from backend.contract.runs import Manifest, RunDir, run_path
from backend.generate.client import BAD_RESPONSE, REJECTED, ChatClient, ClientSettings, RequestFailed, ServerGone
from backend.generate.config import GenerateConfig
from backend.generate.fit import PROMPT_REASONS, ContextLimits, discover
from backend.generate.preflight import run_preflight
from backend.generate.records import ResponseError, build_record, dumps_line
from backend.generate import smoke as smoke_mod
from backend.generate.request import Generated, PromptFitter, Skipped
from backend.generate.tokens import export_token_rows
from backend.generate.writer import DurableWriter, ResumeIndex, WriteFailed, drop_torn_tail, scan_output
from backend.kit import dataset as ds, hostfacts
from backend.kit.lifecycle import StageRun
from backend.kit.preflight import free_bytes, human_bytes

STAGE = "generate"
OUTPUT_FILE = "output.jsonl"
FAILURES_FILE = "failures.jsonl"
SKIPPED_FILE = "skipped.jsonl"  # prompts skipped for their length, found by this process (rewritten per start)
INTERNAL_ERROR = "internal_error"
PERMANENT_FAILURES = frozenset({REJECTED})


@dataclass
class Stats:
    done: int = 0  # durable records, this run and earlier ones
    new_done: int = 0
    failed: Counter = field(default_factory=Counter)  # by reason (client.REASONS, BAD_RESPONSE, ...)
    skipped: Counter = field(default_factory=Counter)  # by reason (dataset.BAD_*, fit.PROMPT_REASONS)
    truncated: int = 0
    reasoning_captured: int = 0
    reduced: int = 0  # records whose max_tokens was cut to fit the context
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def from_index(cls, index: ResumeIndex) -> "Stats":
        return cls(done=index.records, truncated=index.truncated, reasoning_captured=index.reasoning_captured,
                   reduced=index.reduced, prompt_tokens=index.prompt_tokens,
                   completion_tokens=index.completion_tokens)

    def book(self, meta: tuple[bool, bool, int, int, bool]) -> None:
        truncated, reasoning, prompt_tokens, completion_tokens, reduced = meta
        self.done += 1
        self.new_done += 1
        self.truncated += truncated
        self.reasoning_captured += reasoning
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.reduced += reduced

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    @property
    def failed_permanent(self) -> int:
        return sum(n for reason, n in self.failed.items() if reason in PERMANENT_FAILURES)

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return round(self.new_done / elapsed, 3) if elapsed > 0 else 0.0


def identity_of(config: GenerateConfig, info: ds.DatasetInfo, rows: int) -> dict[str, Any]:
    """What makes a run the same run: changing any of these refuses a resume."""
    return {"dataset": info.path, "dataset_files": info.files, "sample_count": rows, "model": config.model,
            "max_tokens": config.max_tokens, "sampling": config.sampling_params(),
            "chat_template_kwargs": config.chat_template_kwargs, "return_token_ids": config.return_token_ids}


class Runner:
    def __init__(self, config: GenerateConfig, api_key: str | None = None):
        self.config = config
        self.api_key = api_key
        self.stop = asyncio.Event()
        self.stop_status = "stopped"
        self.fatal: str | None = None
        self.disk_full = False
        self.ctx: StageRun | None = None
        self.writer: DurableWriter | None = None
        self.extra: dict[str, Any] = {}
        self.pipeline_running = False
        self.stats = Stats()
        self.rows = 0
        self.limits = ContextLimits()
        self.fitter: PromptFitter | None = None
        self.first_rejection = ""  # the server's message for the first permanently failed sample
        self.selection: Any = None  # --sources: the seeded selection (backend/generate/sources.py)
        self.by_source: Counter = Counter()  # --sources: done samples per source
        self.preflight_warnings: list[str] = []  # the host's integrity (backend/kit/hostfacts.py), said at start

    # -- events that must never take the run down (the disk may be full) --
    def emit(self, kind: str, **data: Any) -> None:
        if self.ctx is not None:
            self.ctx.emit(kind, **data)  # backend/kit/lifecycle.py: never takes the run down
        elif kind in ("error", "pause", "resume"):
            print(f"generate: {kind}: {data.get('message') or data.get('reason') or data}", file=sys.stderr)

    def fail(self, message: str) -> None:
        if self.fatal is None:
            self.fatal = message
            self.emit("error", message=message, fatal=True)
        self.stop.set()

    def progress(self, writer: DurableWriter | None) -> dict[str, Any]:
        """The counters every start, progress and finish event carries, counted the same way in each."""
        s = self.stats
        return {"done": s.done, "total": self.rows, "failed": s.failed_total, "failed_by_reason": dict(s.failed),
                "failed_permanent": s.failed_permanent, "skipped": sum(s.skipped.values()),
                "skipped_by_reason": dict(s.skipped), "reduced": s.reduced, "truncated": s.truncated,
                "reasoning_captured": s.reasoning_captured, "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens, "rate": s.rate(),
                "bytes_written": writer.durable_size if writer is not None else None,
                "free_disk": self._free(writer.path) if writer is not None else None,
                **({"by_source": {"done": dict(self.by_source), "selected": self.selection.counts()}}
                   if self.selection is not None else {})}

    @staticmethod
    def _free(path: str) -> int | None:
        try:
            return free_bytes(path)
        except OSError:
            return None

    async def run(self) -> int:
        c = self.config
        if c.sources:
            from backend.generate import sources

            try:
                self.selection = sources.plan(c.sources, c.sample_total, c.selection_seed)
            except sources.SourceError as exc:
                raise ds.DatasetError(str(exc)) from None
            info = ds.DatasetInfo(path="sources", files=[f for s in self.selection.sources for f in s.info.files],
                                  rows=self.selection.total)
        else:
            info = ds.describe(c.dataset)
        if info.rows == 0 and c.limit != 0:
            raise ds.DatasetError(f"{c.dataset or 'the sources'}: the dataset has no rows (its files are empty)")
        self.rows = min(info.rows, c.limit) if c.limit is not None else info.rows
        avg_row = (sum(f["size"] for f in info.files) // info.rows) if info.rows else 0
        settings = ClientSettings(base_url=c.endpoint, concurrency=c.concurrency,
                                  request_timeout=c.request_timeout, max_retries=c.max_retries,
                                  backoff_base=c.backoff_base, backoff_max=c.backoff_max,
                                  health_interval=c.health_interval, max_pause_s=c.max_pause_s,
                                  api_key=self.api_key)
        identity = identity_of(c, info, self.rows)
        if self.selection is not None:
            identity.update(self.selection.identity())
        manifest = Manifest(stage=STAGE, run_id=c.run_id, identity=identity,
                            settings={"endpoint": c.endpoint, "concurrency": c.concurrency,
                                      "request_timeout": c.request_timeout, "max_retries": c.max_retries,
                                      "long_prompt": c.long_prompt})
        async with ChatClient(settings) as client:
            if c.preflight_only:
                report = await run_preflight(c, client, run_dir=run_path(c.work_dir, c.run_id),
                                             samples=self.rows, avg_row_bytes=avg_row)
                print(json.dumps(report.to_dict(), indent=2))
                return exitcodes.COMPLETED if report.ok else exitcodes.FAILED
            ctx = self.ctx = StageRun(STAGE, c.run_id, work_dir=c.work_dir, manifest=manifest, fresh=c.fresh,
                                      mode="flag", failures=(ds.DatasetError,))
            ctx.on_stop(self._on_stop)
            # provenance: the baseline's command line as it runs (the listener's own), else as the console says
            ctx.server_command = hostfacts.serving_command(c.endpoint) or c.server_command
            ctx.stop_note = (f"finishing in-flight requests (up to {c.stop_grace_s:g} s), then stopping")
            ctx.summarize = self._summarize
            return await ctx.arun(lambda ctx: self._run(ctx.run_dir, client, avg_row))

    def _on_stop(self, _name: str) -> None:
        """In the pipeline: let in-flight requests finish (their records are booked); before it: stop now."""
        self.stop.set()
        if not self.pipeline_running and self.ctx is not None:
            self.ctx.cancel_body()

    async def _run(self, run_dir: RunDir, client: ChatClient, avg_row: int) -> None:
        c = self.config
        out_path = run_dir.file(OUTPUT_FILE)
        index = scan_output(out_path)
        side = drop_torn_tail(out_path, index)
        if side:
            self.emit("error", fatal=False, message=f"dropped a torn last line ({index.torn_bytes} bytes) "
                      f"from {OUTPUT_FILE} after an interrupted write; its bytes are kept in {side}")
        if index.bad_lines:
            self.emit("error", fatal=False, message=f"{index.bad_lines} unreadable lines in {OUTPUT_FILE} "
                      f"are skipped; their samples will be generated again")
        self.stats = Stats.from_index(index)
        if self.selection is not None:
            from backend.generate.sources import done_by_source

            self.by_source = Counter(done_by_source(index.done_ids, self.selection))
        token_ids = c.return_token_ids != "off"
        if not c.skip_preflight:
            remaining = max(0, self.rows - index.records)
            report = await run_preflight(c, client, run_dir=run_dir.path, samples=remaining, avg_row_bytes=avg_row)
            if not report.ok:
                self.fail(f"preflight failed: {report.failures()}")
                self.extra = {"preflight": report.to_dict()}
                return
            self.preflight_warnings = report.warnings()
            if c.return_token_ids == "auto":
                token_ids = bool(report.token_ids)
            self.limits = report.context or ContextLimits()
        else:
            self.limits = await discover(client, c.model, c.chat_template_kwargs)
        assert self.ctx is not None
        # the smoke belongs to the checks before the work: --skip-preflight skips it too
        smoke = await self._smoke(client) if c.smoke and not c.skip_preflight and index.records < self.rows else None
        self.ctx.start(**self.progress(None), already_done=index.records, token_ids=token_ids,
                       context=self.limits.to_dict(), smoke=smoke.to_dict() if smoke is not None else None)
        for warning in [*self.preflight_warnings, *(smoke.warnings if smoke is not None else ())]:
            self.emit("error", fatal=False, message=f"warning: {warning}")
        writer = self.writer = DurableWriter(out_path, flush_every=c.flush_every)
        failures = DurableWriter(run_dir.file(FAILURES_FILE), flush_every=1)
        skipped = self._open_skipped(run_dir)
        self.pipeline_running = True
        client.attach_gate(on_pause=lambda reason: self.emit("pause", reason=reason),
                           on_resume=lambda waited: self.emit("resume", waited_s=round(waited, 1)))
        self.stats.started = time.monotonic()  # the rate counts generation, not the preflight
        try:
            await self._pipeline(client, writer, failures, skipped, index.done_ids, token_ids)
        finally:
            await self._final_flush(writer, failures, skipped)
            writer.close()
            failures.close()
            skipped.close()
        extra: dict[str, Any] = {}
        if self.fitter is not None:
            extra["context"] = {**self.limits.to_dict(), "tokenize": self.fitter.tokenize_ok,
                                "measured": self.fitter.measured, "probed": self.fitter.probed}
        if (token_ids and c.token_rows and self.fatal is None and self.stats.failed_total == 0
                and not self.stop.is_set()):
            extra["token_rows"] = export_token_rows(out_path, run_dir.file("prepare"))
        self.extra = extra

    async def _smoke(self, client: ChatClient) -> "smoke_mod.Smoke":
        """The throughput smoke (backend/generate/smoke.py), said on stdout (the run's log) before the work
        starts and kept in this host's history; never a refusal."""
        c = self.config
        print(f"generate: throughput smoke: up to {min(c.concurrency, smoke_mod.SMOKE_MAX_REQUESTS)} requests "
              f"at once, at most {c.smoke_seconds:g} s", flush=True)
        smoke = await smoke_mod.run(client, c, nvidia_smi=c.nvidia_smi, seconds=c.smoke_seconds)
        print(f"generate: {smoke.line()}", flush=True)
        for warning in smoke.warnings:
            print(f"generate: warning: {warning}", flush=True)
        smoke_mod.record(c.work_dir, smoke, c.run_id)
        return smoke

    @staticmethod
    def _open_skipped(run_dir: RunDir) -> DurableWriter:
        # which prompts this pass left out: a resumed run meets them again, so the file starts afresh
        path = run_dir.file(SKIPPED_FILE)
        with open(path, "wb"):
            pass
        return DurableWriter(path, flush_every=256)

    async def _pipeline(self, client: ChatClient, writer: DurableWriter, failures: DurableWriter,
                        skipped: DurableWriter, done_ids: set[str], token_ids: bool) -> None:
        c = self.config
        queue: asyncio.Queue[ds.Sample | None] = asyncio.Queue(maxsize=2 * c.concurrency)
        base: dict[str, Any] = {**c.sampling_params(), "model": c.model, "max_tokens": c.max_tokens}
        if c.chat_template_kwargs:
            base["chat_template_kwargs"] = c.chat_template_kwargs
        if token_ids:
            base["return_token_ids"] = True
        fitter = self.fitter = PromptFitter(
            client, model=c.model, base=base, max_tokens=c.max_tokens, policy=c.long_prompt,
            chat_template_kwargs=c.chat_template_kwargs, limits=self.limits,
            on_note=lambda message: self.emit("error", fatal=False, message=message))

        async def produce() -> None:
            try:
                rows = (self.selection.iter_samples() if self.selection is not None
                        else ds.iter_samples(c.dataset, limit=c.limit))
                for n, item in enumerate(rows):
                    if n % 256 == 0:
                        await asyncio.sleep(0)  # skipping a long done prefix must not starve the loop
                    if self.stop.is_set():
                        return
                    if isinstance(item, ds.BadRow):
                        self.stats.skipped[item.reason] += 1
                        continue
                    if item.sample_id in done_ids:
                        continue
                    await queue.put(item)
            except ds.DatasetError as exc:  # a file that breaks mid-way: its one-line reason
                self.fail(f"reading the dataset failed: {exc}")
                return
            except Exception as exc:  # anything else must still end the run cleanly
                self.fail(f"reading the dataset failed: {type(exc).__name__}: {exc}")
                return
            done_ids.clear()  # the resume index is no longer needed: free it
            for _ in range(c.concurrency):
                await queue.put(None)

        async def work() -> None:
            while not self.stop.is_set():
                item = await queue.get()
                if item is None:
                    return
                try:
                    await self._one(fitter, writer, failures, skipped, item)
                except Exception as exc:  # one bad sample must not take a worker (or the run) down
                    await self._failure(failures, item, f"internal error: {type(exc).__name__}: {exc}", 1,
                                        INTERNAL_ERROR)

        producer = asyncio.create_task(produce())
        workers = [asyncio.create_task(work()) for _ in range(c.concurrency)]
        ticker = asyncio.create_task(self._tick(writer, skipped))
        stopper = asyncio.create_task(self.stop.wait())
        all_workers = asyncio.gather(*workers, return_exceptions=True)
        try:
            await asyncio.wait({all_workers, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if self.stop.is_set():
                producer.cancel()
                while not queue.empty():
                    queue.get_nowait()
                for _ in workers:
                    queue.put_nowait(None)
                pending = [w for w in workers if not w.done()]
                if pending:
                    await asyncio.wait(pending, timeout=0 if self.fatal else c.stop_grace_s)
            for w in workers:
                w.cancel()
            await asyncio.gather(all_workers, producer, return_exceptions=True)
        finally:
            for t in (ticker, stopper, producer, *workers):
                t.cancel()
            await asyncio.gather(ticker, stopper, producer, all_workers, return_exceptions=True)

    async def _one(self, fitter: PromptFitter, writer: DurableWriter, failures: DurableWriter,
                   skipped: DurableWriter, item: ds.Sample) -> None:
        try:
            outcome = await fitter.generate(item.prompt)
        except RequestFailed as exc:
            if exc.permanent and not self.first_rejection:
                self.first_rejection = f"HTTP {exc.status}: {exc.server_message[:200]}"
            await self._failure(failures, item, str(exc), exc.attempts, exc.reason)
            return
        except (ResponseError, ValueError) as exc:
            await self._failure(failures, item, f"unusable response: {exc}", 1, BAD_RESPONSE)
            return
        except ServerGone as exc:
            self.fail(str(exc))
            return
        if self.fatal:
            return
        if isinstance(outcome, Skipped):
            self._skip(skipped, item, outcome)
            return
        assert isinstance(outcome, Generated)
        completion = outcome.completion
        record = build_record(sample_id=item.sample_id, index=item.index, model=self.config.model,
                              prompt=item.prompt, completion=completion, source=item.source,
                              max_tokens=outcome.max_tokens, max_tokens_reduced=outcome.reduced)
        meta = (record["truncated"], record["reasoning_captured"], completion.prompt_tokens or 0,
                completion.completion_tokens or 0, outcome.reduced)
        if self.selection is not None:
            from backend.generate.sources import source_of

            self.by_source[source_of(item.sample_id)] += 1
        if writer.append(dumps_line(record), meta):
            await self._flush(writer)

    def _skip(self, skipped: DurableWriter, item: ds.Sample, outcome: Skipped) -> None:
        self.stats.skipped[outcome.reason] += 1
        skipped.append(dumps_line({"id": item.sample_id, "index": item.index, "reason": outcome.reason,
                                   "prompt_tokens": outcome.prompt_tokens, "max_model_len": outcome.max_model_len,
                                   "max_tokens": self.config.max_tokens, "detail": outcome.detail,
                                   "ts": round(time.time(), 3)}))

    async def _flush(self, writer: DurableWriter) -> None:
        try:
            durable = await writer.flush()
            for meta in durable:
                self.stats.book(meta)
            if durable and not self.fatal:
                # what is on disk, the moment it is: a run killed now still shows its true count
                self.emit("progress", **self.progress(writer))
        except WriteFailed as exc:
            writer.discard()
            self.disk_full = self.disk_full or exc.disk_full
            self.fail(f"{exc}. Free space on that volume (or move --work-dir), then rerun the same "
                      f"command: the run resumes where the file ends" if exc.disk_full else str(exc))

    async def _failure(self, failures: DurableWriter, item: ds.Sample, error: str, attempts: int,
                       reason: str) -> None:
        self.stats.failed[reason] += 1
        line = dumps_line({"id": item.sample_id, "index": item.index, "reason": reason,
                           "permanent": reason in PERMANENT_FAILURES, "error": error, "attempts": attempts,
                           "ts": round(time.time(), 3)})
        failures.append(line)
        try:
            await failures.flush()
        except WriteFailed as exc:
            failures.discard()
            self.fail(str(exc))

    async def _tick(self, writer: DurableWriter, skipped: DurableWriter) -> None:
        c = self.config
        while True:
            await asyncio.sleep(c.progress_interval)
            if self.fatal:
                return
            await self._flush(writer)
            await self._flush_side(skipped)
            free = self._free(writer.path)
            if free is not None and free < c.min_free_bytes:
                self.fail(f"only {human_bytes(free)} free on the volume of {writer.path} (under "
                          f"--min-free-bytes {human_bytes(c.min_free_bytes)}); stopping before the disk fills. "
                          f"Free space or move --work-dir, then rerun the same command to resume")
                return
            self.emit("progress", **self.progress(writer))

    async def _flush_side(self, side: DurableWriter) -> None:
        try:
            await side.flush()
        except WriteFailed:
            side.discard()  # a side file must not stop the run; its counts are in the events

    async def _final_flush(self, writer: DurableWriter, failures: DurableWriter, skipped: DurableWriter) -> None:
        if writer.pending and not self.disk_full:
            await self._flush(writer)
        for side in (failures, skipped):
            try:
                side.flush_sync()
            except WriteFailed:
                side.discard()

    def _summarize(self, status: str, error: str | None) -> dict[str, Any]:
        """The summary (backend/kit/lifecycle.py writes it and the finish): the counters decide, unless the body
        ended on something it did not expect (a full disk, a crash), which fails the run with that reason."""
        assert self.ctx is not None
        if status == "failed" and error and self.fatal is None:
            self.fatal = error
        s = self.stats
        writer = self.writer
        status, error, note = settle(fatal=self.fatal, stopped=self.stop.is_set() or status == "stopped",
                                     rows=self.rows, done=s.done, failed=s.failed, skipped=s.skipped,
                                     reduced=s.reduced, first_rejection=self.first_rejection)
        summary: dict[str, Any] = {"stage": STAGE, "run_id": self.config.run_id, "status": status}
        summary.update(self.progress(writer))
        summary.update({"output": self.ctx.file(OUTPUT_FILE), "failures": self.ctx.file(FAILURES_FILE),
                        "elapsed_s": round(time.monotonic() - s.started, 3)})
        if writer is not None:
            summary["skipped_prompts"] = self.ctx.file(SKIPPED_FILE)
        if error:
            summary["error"] = error
        if note:
            summary["note"] = note
        summary.update(self.extra)
        line = f"generate: {status}: {summary.get('done', 0)} done"
        line += f", {summary.get('failed', 0)} failed{_by_reason(s.failed)}"
        line += f", {summary.get('skipped', 0)} skipped{_by_reason(s.skipped)}"
        if s.reduced:
            line += f", {s.reduced} with a reduced max_tokens"
        print(line + (f" ({error})" if error else ""), file=sys.stderr)
        return summary


def _by_reason(counts: Counter | dict[str, int]) -> str:
    items = [f"{reason}: {n}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n]
    return f" ({', '.join(items)})" if items else ""


def settle(*, fatal: str | None, stopped: bool, rows: int, done: int, failed: Counter | dict[str, int],
           skipped: Counter | dict[str, int], reduced: int, first_rejection: str = "") -> tuple[str, str, str]:
    """(status, error, note) of a finished run. Pure.

    Rerunning is suggested only when something failed that a rerun can fix (a transient failure); a
    sample the server rejected fails the run without that advice; prompts skipped for their length (or
    bad rows) are counted and do not fail a run, unless nothing at all could be generated.
    """
    permanent = sum(n for reason, n in failed.items() if reason in PERMANENT_FAILURES)
    transient = sum(failed.values()) - permanent
    skips = sum(skipped.values())
    note_parts = []
    if skips:
        prompts = any(reason in PROMPT_REASONS for reason in skipped)
        listed = f" (the prompts are listed in {SKIPPED_FILE})" if prompts else ""
        note_parts.append(f"{skips} skipped{_by_reason(skipped)}{listed}")
    if reduced:
        note_parts.append(f"{reduced} sent with max_tokens reduced to fit the context (max_tokens_reduced "
                          f"in their records)")
    note = "; ".join(note_parts)
    if fatal:
        return "failed", fatal, note
    if stopped:
        return "stopped", "", note
    if transient or permanent:
        parts = []
        if transient:
            retryable = {r: n for r, n in failed.items() if r not in PERMANENT_FAILURES}
            parts.append(f"{transient} samples failed{_by_reason(retryable)} (see {FAILURES_FILE}); rerun the "
                         f"same command to retry them")
        if permanent:
            parts.append(f"{permanent} samples were rejected by the server ({first_rejection or 'HTTP 4xx'}); "
                         f"retrying cannot help them: see {FAILURES_FILE} for what the server said")
        return "failed", "; ".join(parts), note
    if rows and not done:
        return "failed", (f"no usable rows: none of the {rows} rows produced a record; "
                          f"{skips} skipped{_by_reason(skipped)}"), note
    return "completed", "", note
