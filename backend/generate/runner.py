"""The generation run: dataset -> bounded queue -> `concurrency` workers -> durable output.

Memory stays flat whatever the sample count: the producer feeds a queue of 2 x concurrency items
and a fixed pool of workers drains it (no task per sample). Counters that reach the summary are
booked only once a record is fsynced, so a crash never reports work that is not on disk.
"""
from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from backend.events import EventLog
from backend.generate import dataset as ds
from backend.generate.client import ChatClient, ClientSettings, RequestFailed, ServerGone
from backend.generate.config import GenerateConfig
from backend.generate.preflight import free_bytes, run_preflight
from backend.generate.records import ResponseError, build_record, dumps_line, loads, parse_completion
from backend.generate.tokens import export_token_rows
from backend.generate.writer import DurableWriter, ResumeIndex, WriteFailed, drop_torn_tail, scan_output
from backend.runs import Manifest, RunDir, open_run_dir, run_path

STAGE = "generate"
OUTPUT_FILE = "output.jsonl"
FAILURES_FILE = "failures.jsonl"


@dataclass
class Stats:
    done: int = 0  # durable records, this run and earlier ones
    new_done: int = 0
    failed: int = 0
    skipped: Counter = field(default_factory=Counter)
    truncated: int = 0
    reasoning_captured: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def from_index(cls, index: ResumeIndex) -> "Stats":
        return cls(done=index.records, truncated=index.truncated, reasoning_captured=index.reasoning_captured,
                   prompt_tokens=index.prompt_tokens, completion_tokens=index.completion_tokens)

    def book(self, meta: tuple[bool, bool, int, int]) -> None:
        truncated, reasoning, prompt_tokens, completion_tokens = meta
        self.done += 1
        self.new_done += 1
        self.truncated += truncated
        self.reasoning_captured += reasoning
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

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
        self.events: EventLog | None = None
        self.stats = Stats()
        self.rows = 0

    # -- events that must never take the run down (the disk may be full) --
    def emit(self, kind: str, **data: Any) -> None:
        if kind in ("error", "pause", "resume"):
            print(f"generate: {kind}: {data.get('message') or data.get('reason') or data}", file=sys.stderr)
        if self.events is None:
            return
        try:
            self.events.emit(kind, **data)
        except OSError as exc:
            print(f"generate: could not write the {kind} event: {exc}", file=sys.stderr)

    def fail(self, message: str) -> None:
        if self.fatal is None:
            self.fatal = message
            self.emit("error", message=message, fatal=True)
        self.stop.set()

    def progress(self, writer: DurableWriter) -> dict[str, Any]:
        s = self.stats
        skipped = sum(s.skipped.values())
        return {"done": s.done, "total": max(0, self.rows - skipped), "failed": s.failed, "skipped": skipped,
                "skipped_by_reason": dict(s.skipped), "truncated": s.truncated,
                "reasoning_captured": s.reasoning_captured, "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens, "rate": s.rate(),
                "bytes_written": writer.durable_size, "free_disk": self._free(writer.path)}

    @staticmethod
    def _free(path: str) -> int | None:
        try:
            return free_bytes(path)
        except OSError:
            return None

    async def run(self) -> int:
        c = self.config
        info = ds.describe(c.dataset)
        self.rows = min(info.rows, c.limit) if c.limit is not None else info.rows
        avg_row = (sum(f["size"] for f in info.files) // info.rows) if info.rows else 0
        settings = ClientSettings(base_url=c.endpoint, concurrency=c.concurrency,
                                  request_timeout=c.request_timeout, max_retries=c.max_retries,
                                  backoff_base=c.backoff_base, backoff_max=c.backoff_max,
                                  health_interval=c.health_interval, max_pause_s=c.max_pause_s,
                                  api_key=self.api_key)
        manifest = Manifest(stage=STAGE, run_id=c.run_id, identity=identity_of(c, info, self.rows),
                            settings={"endpoint": c.endpoint, "concurrency": c.concurrency,
                                      "request_timeout": c.request_timeout, "max_retries": c.max_retries})
        async with ChatClient(settings) as client:
            if c.preflight_only:
                report = await run_preflight(c, client, run_dir=run_path(c.work_dir, c.run_id),
                                             samples=self.rows, avg_row_bytes=avg_row)
                print(json.dumps(report.to_dict(), indent=2))
                return 0 if report.ok else 1
            run_dir = open_run_dir(c.work_dir, c.run_id, manifest, fresh=c.fresh)
            self.events = EventLog(run_dir.events_path, STAGE, c.run_id)
            try:
                return await self._run(run_dir, client, avg_row)
            finally:
                self.events.close()

    async def _run(self, run_dir: RunDir, client: ChatClient, avg_row: int) -> int:
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
        token_ids = c.return_token_ids != "off"
        if not c.skip_preflight:
            remaining = max(0, self.rows - index.records)
            report = await run_preflight(c, client, run_dir=run_dir.path, samples=remaining, avg_row_bytes=avg_row)
            if not report.ok:
                self.fail(f"preflight failed: {report.failures()}")
                return self._finish(run_dir, None, extra={"preflight": report.to_dict()})
            if c.return_token_ids == "auto":
                token_ids = bool(report.token_ids)
        self.emit("start", total=self.rows, manifest=run_dir.manifest.to_dict(), resumed=run_dir.resumed,
                  already_done=index.records, token_ids=token_ids)
        writer = DurableWriter(out_path, flush_every=c.flush_every)
        failures = DurableWriter(run_dir.file(FAILURES_FILE), flush_every=1)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        client.attach_gate(on_pause=lambda reason: self.emit("pause", reason=reason),
                           on_resume=lambda waited: self.emit("resume", waited_s=round(waited, 1)))
        self.stats.started = time.monotonic()  # the rate counts generation, not the preflight
        try:
            await self._pipeline(client, writer, failures, index.done_ids, token_ids)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await self._final_flush(writer, failures)
            writer.close()
            failures.close()
        extra: dict[str, Any] = {}
        if token_ids and c.token_rows and self.fatal is None and self.stats.failed == 0 and not self.stop.is_set():
            extra["token_rows"] = export_token_rows(out_path, run_dir.file("prepare"))
        return self._finish(run_dir, writer, extra=extra)

    def _on_signal(self, sig: int) -> None:
        self.emit("error", fatal=False, message=f"received {signal.Signals(sig).name}: finishing in-flight "
                  f"requests (up to {self.config.stop_grace_s:g} s), then stopping")
        self.stop.set()

    async def _pipeline(self, client: ChatClient, writer: DurableWriter, failures: DurableWriter,
                        done_ids: set[str], token_ids: bool) -> None:
        c = self.config
        queue: asyncio.Queue[ds.Sample | None] = asyncio.Queue(maxsize=2 * c.concurrency)
        base: dict[str, Any] = {**c.sampling_params(), "model": c.model, "max_tokens": c.max_tokens}
        if c.chat_template_kwargs:
            base["chat_template_kwargs"] = c.chat_template_kwargs
        if token_ids:
            base["return_token_ids"] = True

        async def produce() -> None:
            try:
                for n, item in enumerate(ds.iter_samples(c.dataset, limit=c.limit)):
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
            except Exception as exc:  # a dataset that breaks mid-way must still end the run cleanly
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
                    await self._one(client, writer, failures, base, item)
                except Exception as exc:  # one bad sample must not take a worker (or the run) down
                    await self._failure(failures, item, f"internal error: {type(exc).__name__}: {exc}", 1)

        producer = asyncio.create_task(produce())
        workers = [asyncio.create_task(work()) for _ in range(c.concurrency)]
        ticker = asyncio.create_task(self._tick(writer))
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

    async def _one(self, client: ChatClient, writer: DurableWriter, failures: DurableWriter,
                   base: dict[str, Any], item: ds.Sample) -> None:
        body = dumps_line({**base, "messages": item.prompt})
        try:
            raw, _attempts = await client.chat(body)
            completion = parse_completion(loads(raw))
        except RequestFailed as exc:
            await self._failure(failures, item, str(exc), exc.attempts)
            return
        except (ResponseError, ValueError) as exc:
            await self._failure(failures, item, f"unusable response: {exc}", 1)
            return
        except ServerGone as exc:
            self.fail(str(exc))
            return
        if self.fatal:
            return
        record = build_record(sample_id=item.sample_id, index=item.index, model=self.config.model,
                              prompt=item.prompt, completion=completion, source=item.source)
        meta = (record["truncated"], record["reasoning_captured"], completion.prompt_tokens or 0,
                completion.completion_tokens or 0)
        if writer.append(dumps_line(record), meta):
            await self._flush(writer)

    async def _flush(self, writer: DurableWriter) -> None:
        try:
            for meta in await writer.flush():
                self.stats.book(meta)
        except WriteFailed as exc:
            writer.discard()
            self.disk_full = self.disk_full or exc.disk_full
            self.fail(f"{exc}. Free space on that volume (or move --work-dir), then rerun the same "
                      f"command: the run resumes where the file ends" if exc.disk_full else str(exc))

    async def _failure(self, failures: DurableWriter, item: ds.Sample, error: str, attempts: int) -> None:
        self.stats.failed += 1
        line = dumps_line({"id": item.sample_id, "index": item.index, "error": error, "attempts": attempts,
                           "ts": round(time.time(), 3)})
        failures.append(line)
        try:
            await failures.flush()
        except WriteFailed as exc:
            failures.discard()
            self.fail(str(exc))

    async def _tick(self, writer: DurableWriter) -> None:
        c = self.config
        while True:
            await asyncio.sleep(c.progress_interval)
            if self.fatal:
                return
            await self._flush(writer)
            free = self._free(writer.path)
            if free is not None and free < c.min_free_bytes:
                self.fail(f"only {free / 1e6:.1f} MB free on the volume of {writer.path} (under "
                          f"--min-free-bytes {c.min_free_bytes}); stopping before the disk fills. Free "
                          f"space or move --work-dir, then rerun the same command to resume")
                return
            self.emit("progress", **self.progress(writer))

    async def _final_flush(self, writer: DurableWriter, failures: DurableWriter) -> None:
        if writer.pending and not self.disk_full:
            await self._flush(writer)
        try:
            failures.flush_sync()
        except WriteFailed:
            failures.discard()

    def _finish(self, run_dir: RunDir, writer: DurableWriter | None, extra: dict[str, Any]) -> int:
        if self.fatal:
            status = "failed"
        elif self.stop.is_set():
            status = "stopped"
        elif self.stats.failed:
            status = "failed"
        else:
            status = "completed"
        summary: dict[str, Any] = {"stage": STAGE, "run_id": self.config.run_id, "status": status}
        if writer is not None:
            summary.update(self.progress(writer))
        summary.update({"output": run_dir.file(OUTPUT_FILE), "failures": run_dir.file(FAILURES_FILE),
                        "elapsed_s": round(time.monotonic() - self.stats.started, 3)})
        if self.fatal:
            summary["error"] = self.fatal
        elif self.stats.failed:
            summary["error"] = (f"{self.stats.failed} samples failed after retries (see {FAILURES_FILE}); "
                                f"rerun the same command to retry them")
        summary.update(extra)
        try:
            run_dir.write_summary(summary)
        except OSError as exc:
            print(f"generate: could not write {run_dir.summary_path}: {exc}", file=sys.stderr)
        self.emit("finish", status=status, summary=summary)
        print(f"generate: {status}: {summary.get('done', 0)} done, {summary.get('failed', 0)} failed, "
              f"{summary.get('skipped', 0)} skipped" + (f" ({summary['error']})" if "error" in summary else ""),
              file=sys.stderr)
        return 0 if status in ("completed", "stopped") else 1
