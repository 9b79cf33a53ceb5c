"""The throughput smoke before a long generation (issue 31 item 9).

A thermally throttled GPU or a slow NCCL path shows only hours into a 5-hour run. So before the real work a
short burst goes to the baseline: up to `concurrency` requests at once (the run's own concurrency, at most
SMOKE_MAX_REQUESTS), each a short answer, the whole burst bounded to SMOKE_S seconds. Its output tokens/s
is said beside this host's previous smokes of the same model at the same concurrency (`state/smoke.jsonl`
in the work dir, read through backend/contract/numbers.finite: another program's file), together with the
GPUs' clock-throttle reasons. It warns, never refuses: a rate well below the history (WELL_BELOW of its
median) or an active throttle reason other than "GPU idle". `--no-smoke` (profile `[generate] smoke = false`)
skips it.

The throttle reasons are `nvidia-smi --query-gpu=index,clocks_throttle_reasons.active --format=csv,noheader`:
a hex bit mask per GPU (NVML's nvmlClocksThrottleReason* / nvmlClocksEventReason* values, below). Drivers
from R535 name the field clocks_event_reasons.active and keep the old name as an alias; a driver that knows
only the new name is asked again with it.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import aiohttp

from backend.contract.numbers import finite
from backend.generate.client import ChatClient
from backend.generate.config import GenerateConfig
from backend.generate.records import ResponseError, dumps_line, loads, parse_completion

SMOKE_S = 25.0  # the burst's whole time, whatever the server does
SMOKE_MAX_TOKENS = 128
SMOKE_MAX_REQUESTS = 256
SMOKE_PROMPT = "Count from one to forty in words, separated by commas."
HISTORY_FILE = os.path.join("state", "smoke.jsonl")
HISTORY_READ_MAX = 4 << 20  # the file's last 4 MiB (its last thousands of smokes)
HISTORY_COMPARED = 10  # the last N smokes of the same model and concurrency
WELL_BELOW = 0.7  # a rate under 70% of the history's median is said as a warning
SMI_TIMEOUT_S = 10.0
THROTTLE_FIELDS = ("clocks_throttle_reasons.active", "clocks_event_reasons.active")
# NVML's clock throttle (event) reasons, nvml.h; GPU idle is the one that says nothing is wrong
REASONS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
IDLE = 0x1


@dataclass
class Smoke:
    model: str
    concurrency: int
    requests: int = 0
    completed: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    tokens_per_s: float | None = None
    history: list[float] = field(default_factory=list)  # previous smokes' tokens/s, oldest first
    throttle: list[dict[str, Any]] | None = None  # per GPU: index, mask, reasons; None: not asked
    throttle_note: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.history) if self.history else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "history_median": self.median}

    def line(self) -> str:
        """One line: the rate beside the history, the throttle reasons."""
        rate = (f"{self.tokens_per_s:.1f} tokens/s" if self.tokens_per_s is not None else "no rate")
        head = (f"throughput smoke: {rate} ({self.completed}/{self.requests} requests at concurrency "
                f"{self.concurrency}, {self.completion_tokens} tokens in {self.seconds:.1f} s)")
        median = self.median
        hist = (f"this host's previous {len(self.history)}: median {median:.1f} tokens/s, "
                f"last {self.history[-1]:.1f}" if median is not None
                else "no earlier smoke of this model at this concurrency on this host")
        return f"{head}; {hist}; clocks: {throttle_text(self.throttle, self.throttle_note)}"


def throttle_text(rows: list[dict[str, Any]] | None, note: str = "") -> str:
    if rows is None:
        return note or "not asked"
    busy = [f"GPU {r['index']}: {', '.join(r['reasons']) or hex(r['mask'])}" for r in rows
            if r["mask"] & ~IDLE]
    return "; ".join(busy) if busy else f"no throttle reason on {len(rows)} GPU(s)"


# -- the GPUs' clock-throttle reasons ----------------------------------------------------------------------
_ROW = re.compile(r"^\s*(\d+)\s*,\s*(0x[0-9a-fA-F]{1,16})\s*$")


def parse_throttle(text: str) -> list[dict[str, Any]]:
    """`0, 0x0000000000000001` rows (index, mask) -> [{index, mask, reasons}]; other lines are skipped."""
    rows = []
    for line in text.splitlines()[:1024]:
        m = _ROW.match(line)
        if m:
            mask = int(m.group(2), 16)
            rows.append({"index": int(m.group(1)), "mask": mask,
                         "reasons": [name for bit, name in REASONS.items() if mask & bit]
                         + ([hex(mask & ~sum(REASONS))] if mask & ~sum(REASONS) else [])})
    return rows


def throttle_reasons(smi: Sequence[str]) -> tuple[list[dict[str, Any]] | None, str]:
    """(rows, "") or (None, why not): the old field name first, then the new one."""
    note = ""
    for name in THROTTLE_FIELDS:
        try:
            done = subprocess.run([*smi, f"--query-gpu=index,{name}", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{smi[0]} did not answer ({type(exc).__name__})"
        rows = parse_throttle(done.stdout[:1 << 20]) if done.returncode == 0 else []
        if rows:
            return rows, ""
        note = f"{smi[0]} --query-gpu={name}: exit {done.returncode}"
    return None, note


# -- this host's history -----------------------------------------------------------------------------------
def history_path(work_dir: str) -> str:
    return os.path.join(work_dir, HISTORY_FILE)


def read_history(work_dir: str, model: str, concurrency: int) -> list[float]:
    """The last HISTORY_COMPARED smokes' tokens/s of `model` at `concurrency`, oldest first; a bad line is
    skipped (another run may have written it half, or anything may have)."""
    try:
        with open(history_path(work_dir), "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - HISTORY_READ_MAX))
            data = fh.read(HISTORY_READ_MAX)
    except OSError:
        return []
    rates: list[float] = []
    for raw in data.splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("model") != model or rec.get("concurrency") != concurrency:
            continue
        rate = finite(rec.get("tokens_per_s"))
        if rate is not None and rate > 0:
            rates.append(rate)
    return rates[-HISTORY_COMPARED:]


def record(work_dir: str, smoke: Smoke, run_id: str) -> None:
    """One line appended (O_APPEND: two runs' lines never interleave); a failure is not the run's."""
    if smoke.tokens_per_s is None:
        return
    line = json.dumps({"ts": round(time.time(), 3), "run_id": run_id, "model": smoke.model,
                       "concurrency": smoke.concurrency, "tokens_per_s": round(smoke.tokens_per_s, 3),
                       "requests": smoke.requests, "completed": smoke.completed}) + "\n"
    path = history_path(work_dir)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def judge(smoke: Smoke) -> list[str]:
    """The warnings (pure): a rate well below the history, a throttle reason other than idle."""
    out = []
    median = smoke.median
    if smoke.tokens_per_s is not None and median is not None and smoke.tokens_per_s < WELL_BELOW * median:
        out.append(f"the throughput smoke ran at {smoke.tokens_per_s:.1f} tokens/s, {smoke.tokens_per_s / median:.0%} "
                   f"of this host's median {median:.1f} over its previous {len(smoke.history)} smokes: check the "
                   f"GPUs' clocks and temperature (nvidia-smi -q -d PERFORMANCE) and the server before a long run")
    if smoke.tokens_per_s is None and smoke.requests:
        out.append(f"the throughput smoke got no answer within {SMOKE_S:g} s ({smoke.completed} of "
                   f"{smoke.requests} requests answered): the server is very slow or stuck")
    if smoke.throttle and any(r["mask"] & ~IDLE for r in smoke.throttle):
        out.append(f"GPU clocks are held down: {throttle_text(smoke.throttle)} (NVML clock throttle reasons)")
    return out


# -- the burst ---------------------------------------------------------------------------------------------
async def _one(client: ChatClient, body: bytes) -> int:
    status, data = await client.post_once(body, timeout=SMOKE_S)
    if status != 200:
        return -1
    try:
        done = parse_completion(loads(data))
    except (ResponseError, ValueError):
        return -1
    return done.completion_tokens or 0


async def burst(client: ChatClient, config: GenerateConfig, smoke: Smoke, seconds: float = SMOKE_S) -> None:
    payload: dict[str, Any] = {**config.sampling_params(), "model": config.model,
                               "messages": [{"role": "user", "content": SMOKE_PROMPT}],
                               "max_tokens": min(config.max_tokens, SMOKE_MAX_TOKENS)}
    if config.chat_template_kwargs:
        payload["chat_template_kwargs"] = config.chat_template_kwargs
    body = dumps_line(payload)
    smoke.requests = min(config.concurrency, SMOKE_MAX_REQUESTS)
    t0 = time.monotonic()
    tasks = [asyncio.ensure_future(_one(client, body)) for _ in range(smoke.requests)]
    done, pending = await asyncio.wait(tasks, timeout=seconds)
    smoke.seconds = round(time.monotonic() - t0, 3)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        exc = task.exception()
        if exc is None and task.result() >= 0:
            smoke.completed += 1
            smoke.completion_tokens += task.result()
        elif exc is not None and not isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, OSError)):
            raise exc
    if smoke.completed and smoke.seconds > 0:
        smoke.tokens_per_s = round(smoke.completion_tokens / smoke.seconds, 3)


async def run(client: ChatClient, config: GenerateConfig, *, nvidia_smi: Sequence[str] | None,
              seconds: float = SMOKE_S) -> Smoke:
    """The smoke: the history read first (this run's own line is not compared with itself), the burst, the
    GPUs' reasons asked right after it (under the load it left), the warnings."""
    smoke = Smoke(model=config.model, concurrency=config.concurrency)
    smoke.history = read_history(config.work_dir, config.model, config.concurrency)
    await burst(client, config, smoke, seconds)
    smi = list(nvidia_smi or ["nvidia-smi"])
    if shutil.which(smi[0]) is None:
        smoke.throttle_note = f"{smi[0]} not found: clock throttle reasons not asked"
    else:
        smoke.throttle, smoke.throttle_note = await asyncio.to_thread(throttle_reasons, smi)
    smoke.warnings = judge(smoke)
    return smoke
