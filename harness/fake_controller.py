"""A Controller with no host behind it: scripted snapshots and journal lines, recorded actions.

Tests push snapshots and lines when they want them (`push`, `push_line`) so nothing depends on timing;
`demo_snapshot` builds a plausible live state for developing the UI and for the idle benchmark.
    python -m harness.fake_controller      # run the console against a simulated, changing host
"""
from __future__ import annotations

import asyncio
import math
import shlex
from dataclasses import replace
from typing import AsyncIterator, Callable

from console.control.disk import DiskReport, PrunePlan
from console.session import ActionResult, Controller, JournalLine
from console.snapshot import (GpuInfo, HostInfo, Progress, RunInfo, ServerInfo, ServiceInfo, Snapshot)
from console.telemetry.history import History

SERVER_UNIT = "eagle3-vllm.service"


def stage_unit(stage: str) -> str:
    return f"eagle3-{stage}.service"


class FakeController:
    def __init__(self, snapshots: list[Snapshot] | None = None,
                 journal: dict[str, list[str]] | None = None, *,
                 profile_name: str = "test-profile", host_name: str = "gpu-host", simulated: bool = False,
                 readonly: bool = False, results: dict[str, ActionResult] | None = None,
                 generator: Callable[[int], Snapshot] | None = None, interval: float = 1.0,
                 journal_rate: float = 0.0, disk: DiskReport | None = None,
                 prune: PrunePlan | None = None) -> None:
        self.profile_name = profile_name
        self.host_name = host_name
        self.simulated = simulated
        self.readonly = readonly
        self.history = History()  # fed with every snapshot yielded, as Session feeds its own
        self.final_error: str | None = None  # a test sets it to end the snapshot stream for good
        self.disk = disk or DiskReport(volumes=(), runs=())
        self.prune = prune or PrunePlan(delete=(), keep=(), total_bytes=0)
        self.calls: list[tuple[str, ...]] = []  # ("stop_stage", "train"), ("close",), ...
        self.journal_units: list[str] = []  # every unit journal() was asked to follow
        self.closed = False
        self._snapshots: asyncio.Queue[Snapshot] | None = None
        self._initial = list(snapshots or [])
        self._journal: dict[str, asyncio.Queue[str]] = {}
        self._initial_journal = {unit: list(lines) for unit, lines in (journal or {}).items()}
        self._results = results or {}
        self._generator = generator  # endless mode: snapshot i every `interval` seconds
        self._interval = interval
        self._journal_rate = journal_rate  # endless mode: synthetic lines per second per unit

    # -- scripting --------------------------------------------------------------------------------

    def _queue(self) -> asyncio.Queue[Snapshot]:
        if self._snapshots is None:
            self._snapshots = asyncio.Queue()
            for snap in self._initial:
                self._snapshots.put_nowait(snap)
        return self._snapshots

    def push(self, snapshot: Snapshot) -> None:
        self._queue().put_nowait(snapshot)

    def _jqueue(self, unit: str) -> asyncio.Queue[str]:
        if unit not in self._journal:
            self._journal[unit] = asyncio.Queue()
            for line in self._initial_journal.get(unit, []):
                self._journal[unit].put_nowait(line)
        return self._journal[unit]

    def push_line(self, unit: str, text: str) -> None:
        self._jqueue(unit).put_nowait(text)

    # -- Controller ---------------------------------------------------------------------------------

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        if self._generator is not None:
            i = 0
            while True:
                yield self._fed(self._generator(i))
                i += 1
                await asyncio.sleep(self._interval)
        queue = self._queue()
        while True:
            yield self._fed(await queue.get())
            if self.final_error:
                return

    def _fed(self, snapshot: Snapshot) -> Snapshot:
        try:
            self.history.add(snapshot)
        except Exception:  # a malformed snapshot (the hostile-value tests push them): the panes say so
            pass
        return snapshot

    async def journal(self, unit: str) -> AsyncIterator[JournalLine]:
        self.journal_units.append(unit)
        if self._journal_rate > 0:
            n = 0
            loop = asyncio.get_running_loop()
            while True:
                n += 1
                yield JournalLine(f"{unit}[{n}]: INFO step {n} throughput {n % 97} tok/s", unit, loop.time())
                await asyncio.sleep(1.0 / self._journal_rate)
        queue = self._jqueue(unit)
        while True:
            yield JournalLine(await queue.get(), unit)

    def _result(self, name: str, argv: list[str]) -> ActionResult:
        if name in self._results:
            return self._results[name]
        return ActionResult(True, f"{name} ok", (shlex.join(argv),))

    def stops_baseline(self, stage: str) -> bool:
        return stage == "extract"

    def downtime(self, stage: str) -> str:
        return "2 server loads of about 22 min each (the last load of kimi here took 22 min): about 44 min of " \
               "loading in all"

    async def start_stage(self, stage: str) -> ActionResult:
        self.calls.append(("start_stage", stage))
        return self._result("start_stage", ["systemctl", "--user", "start", stage_unit(stage)])

    async def stop_stage(self, stage: str) -> ActionResult:
        self.calls.append(("stop_stage", stage))
        return self._result("stop_stage", ["systemctl", "--user", "stop", stage_unit(stage)])

    async def restart_server(self) -> ActionResult:
        self.calls.append(("restart_server",))
        return self._result("restart_server", ["systemctl", "--user", "restart", SERVER_UNIT])

    async def serve_drafter(self, input_run: str | None = None) -> ActionResult:
        self.calls.append(("serve_drafter",) if input_run is None else ("serve_drafter", input_run))
        return self._result("serve_drafter", ["systemd-run", "--unit=eagle3-vllm-drafter", "vllm", "serve"])

    async def serve_baseline(self) -> ActionResult:
        self.calls.append(("serve_baseline",))
        return self._result("serve_baseline", ["systemctl", "--user", "start", SERVER_UNIT])

    async def disk_report(self) -> DiskReport:
        self.calls.append(("disk_report",))
        return self.disk

    async def prune_plan(self) -> PrunePlan:
        self.calls.append(("prune_plan",))
        return self.prune

    async def prune_runs(self, names: list[str]) -> ActionResult:
        self.calls.append(("prune_runs", *names))
        return self._result("prune_runs", ["python", "-m", "backend.kit.disk", "prune", "--delete", *names])

    async def deep_check(self) -> ActionResult:
        self.calls.append(("deep_check",))
        return self._result("deep_check", ["curl", "-sf", "http://127.0.0.1:8000/v1/models"])

    async def close(self) -> None:
        self.calls.append(("close",))
        self.closed = True


def _conforms(fake: FakeController) -> Controller:
    """mypy fails here when the fake lacks a member of the Controller Protocol or has one of another type."""
    return fake


# -- ready-made states ------------------------------------------------------------------------------

def base_snapshot(*, phase: str = "ready", n_gpus: int = 2, reachable: bool = True,
                  taken_at: float = 1_700_000_000.0) -> Snapshot:
    service = ServiceInfo("systemd", SERVER_UNIT, "active", "running", restarts=0,
                          since="2023-11-14 22:13:20 UTC", main_pid=4242, memory_bytes=12 * 2**30)
    server = ServerInfo(phase=phase)  # type: ignore[arg-type]
    if phase == "ready":
        server = ServerInfo("ready", model_id="Qwen/Qwen3-8B", max_model_len=32768, version="0.11.0",
                            reasoning_field="reasoning_content", deep_check="ok: 1 completion, 38 tokens")
    elif phase == "loading_weights":
        server = ServerInfo("loading_weights", Progress(3, 8), eta_s=95, eta_source="shards", eta_ready_s=330,
                            eta_ready_confidence="previous_loads", eta_ready_basis=2)
    elif phase == "failed":
        service = ServiceInfo("systemd", SERVER_UNIT, "failed", "failed", restarts=3,
                              since="2023-11-14 22:13:20 UTC", result="exit-code")
        server = ServerInfo("failed", error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                            "2.00 GiB (GPU 0; 139.8 GiB total capacity)")
    gpus = [GpuInfo(i, "NVIDIA H200", memory_used_mib=20000 + 15000 * i, memory_total_mib=143771,
                    utilization_pct=(37 * (i + 1)) % 101, temperature_c=40 + 3 * i, power_w=150.0 + 40 * i)
            for i in range(n_gpus)]
    return Snapshot(HostInfo("gpu-host", reachable=reachable, rtt_ms=12.5,
                             error=None if reachable else "Connection refused"),
                    service, server, tuple(gpus), taken_at=taken_at)


def generation_run(done: int = 1200, total: int = 5000, ts: float = 1_700_000_000.0) -> RunInfo:
    event = {"ts": ts, "kind": "progress", "stage": "generate", "run_id": "gen-0001", "done": done,
             "total": total, "failed": 3, "skipped": 0, "truncated": done // 25,
             "reasoning_captured": done - done // 50, "prompt_tokens": done * 180,
             "completion_tokens": done * 900, "rate": 4.2, "bytes_written": done * 6100,
             "free_disk": 512 * 2**30}
    return RunInfo("generate", "gen-0001", "running", stage_unit("generate"), done, total, 3, 4.2,
                   (total - done) / 4.2, event)


def training_run(step: int = 120, epoch: float = 1.0, ts: float = 1_700_000_000.0) -> RunInfo:
    loss = 2.0 * math.exp(-step / 200) + 0.3
    event = {"ts": ts, "kind": "progress", "stage": "train", "run_id": "train-0001", "step": step,
             "epoch": epoch, "loss": round(loss, 4), "lr": 1e-4, "acc_k": [0.72, 0.51, 0.36],
             "val_loss": round(loss + 0.05, 4) if step % 100 == 0 else None,
             "checkpoint": f"checkpoints/epoch{int(epoch)}" if step % 100 == 0 else None}
    return RunInfo("train", "train-0001", "running", stage_unit("train"), step, 1000, 0, 1.0,
                   1000 - step, event)


def demo_snapshot(i: int, n_gpus: int = 8, t0: float = 1_700_000_000.0) -> Snapshot:
    """Tick `i` of a live-looking host: GPUs moving, generation and training advancing."""
    snap = base_snapshot(n_gpus=n_gpus, taken_at=t0 + i)
    gpus = tuple(replace(g, utilization_pct=int(50 + 45 * math.sin((i + g.index) / 5)),
                         memory_used_mib=100000 + (i * 97 + g.index * 1000) % 40000) for g in snap.gpus)
    return replace(snap, gpus=gpus, runs=(generation_run(done=min(5000, 1000 + 4 * i), ts=t0 + i),
                                          training_run(step=i + 1, epoch=1 + i // 100, ts=t0 + i)))


def main() -> None:
    from console.ui.app import ConsoleApp

    controller = FakeController(generator=demo_snapshot, journal_rate=2.0, simulated=True, host_name="demo")
    ConsoleApp(controller).run()


if __name__ == "__main__":
    main()
