"""A short history of the things whose shape tells more than their value: per-GPU memory and
utilization, and the server's token rates, over the last few minutes (a stalled load or a throttled
GPU shows as a flat or sagging strip). Kept in the session, fed one snapshot at a time, bounded: one
value per BUCKET_S bucket (the newest seen in it), WINDOW_S in all."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from console.telemetry.snapshot import Snapshot

BUCKET_S = 10.0
WINDOW_S = 300.0
POINTS = int(WINDOW_S / BUCKET_S)


@dataclass
class Series:
    """Bucketed values, oldest first; a bucket with no sample is None (a gap shows as a gap)."""
    buckets: deque

    @classmethod
    def new(cls) -> "Series":
        return cls(deque(maxlen=POINTS))

    def add(self, bucket: int, value: float | None) -> None:
        if self.buckets and self.buckets[-1][0] == bucket:
            self.buckets[-1] = (bucket, value)
            return
        if self.buckets and bucket < self.buckets[-1][0]:
            return  # an older sample (a late refresh): the strip only moves forward
        if self.buckets:
            for missing in range(self.buckets[-1][0] + 1, min(bucket, self.buckets[-1][0] + POINTS + 1)):
                self.buckets.append((missing, None))
        self.buckets.append((bucket, value))

    def values(self) -> list[float | None]:
        return [v for _, v in self.buckets]


class History:
    def __init__(self) -> None:
        self.gpu_memory: dict[int, Series] = {}  # percent of the GPU's memory in use
        self.gpu_util: dict[int, Series] = {}
        self.generation_tps = Series.new()
        self.prompt_tps = Series.new()
        self._last_taken: float | None = None

    def add(self, snap: Snapshot) -> None:
        if not snap.host.reachable or snap.taken_at is None or snap.taken_at == self._last_taken:
            return  # "not answering" repeats the last values: not new samples
        self._last_taken = snap.taken_at
        bucket = int(snap.taken_at // BUCKET_S)
        for gpu in snap.gpus:
            mem = (100.0 * gpu.memory_used_mib / gpu.memory_total_mib
                   if gpu.memory_used_mib is not None and gpu.memory_total_mib else None)
            self.gpu_memory.setdefault(gpu.index, Series.new()).add(bucket, mem)
            self.gpu_util.setdefault(gpu.index, Series.new()).add(bucket, gpu.utilization_pct)
        m = snap.server.metrics
        self.generation_tps.add(bucket, m.generation_tps if m is not None else None)
        self.prompt_tps.add(bucket, m.prompt_tps if m is not None else None)
