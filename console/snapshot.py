"""Typed records the collectors produce and the panes and `status --json` consume.

One snapshot type, shared by the headless CLI and the Textual app, so both always show the same facts.
Every record is a frozen value: a snapshot handed out is never changed afterwards, so two snapshots can
be compared, and a pane can keep the last one without a copy. Field names follow the `status --json`
contract exactly (see README, "status --json").
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# The one definition of the server's load phases. LOAD_ORDER is the order a healthy load moves through
# (phases only move forward within one load); the others are outcomes.
LOAD_ORDER: tuple[str, ...] = (
    "starting", "loading_weights", "compiling", "allocating_kv_cache", "capturing_cuda_graphs",
    "starting_api", "ready",
)
PHASES: tuple[str, ...] = ("stopped", *LOAD_ORDER, "failed", "unknown")
Phase = str  # one of PHASES


@dataclass(frozen=True)
class HostInfo:
    name: str
    reachable: bool = False
    error: str | None = None
    rtt_ms: float | None = None  # the last probe's own round trip, never time spent waiting on a dead link
    simulated: bool = False
    sim_text: str | None = None  # demo host only: which text backend the vLLM stand-in runs
    sim_engine: bool = False  # demo host only: the server is vLLM's own CPU build (sim_text says which)
    # set while a refresh has not answered within its deadline: the values shown are the last known
    not_answering_since: float | None = None
    # pieces of the host's answers skipped because they could not be read (a value of a type or size
    # nobody foresaw), and the last one's reason: counted, never fatal
    unreadable: int = 0
    unreadable_note: str | None = None


@dataclass(frozen=True)
class ServiceInfo:
    manager: str  # "systemd" | "tmux"
    unit: str
    active_state: str = "unknown"
    sub_state: str = "unknown"
    restarts: int | None = None
    since: str | None = None
    since_ts: float | None = None  # `since` as unix seconds, when it could be parsed
    main_pid: int | None = None
    memory_bytes: int | None = None
    result: str | None = None
    invocation: str | None = None  # systemd's InvocationID: which run of the unit the log lines belong to


@dataclass(frozen=True)
class Progress:
    done: int
    total: int


@dataclass(frozen=True)
class ServerMetrics:
    """From vLLM's /metrics (rates over the interval between two scrapes)."""
    requests_running: int | None = None
    requests_waiting: int | None = None
    kv_cache_usage_pct: float | None = None
    generation_tps: float | None = None
    prompt_tps: float | None = None
    spec_acceptance_rate: float | None = None  # accepted / drafted tokens, drafter only
    spec_mean_acceptance_length: float | None = None
    spec_per_position: tuple[float, ...] | None = None
    spec_window_s: float | None = None  # the window (between two scrapes) the spec_* figures cover


@dataclass(frozen=True)
class SpecLogStats:
    """The server's last `SpecDecoding metrics:` log line (vLLM prints one per stats interval)."""
    mean_acceptance_length: float | None = None
    acceptance_pct: float | None = None  # "Avg Draft acceptance rate", percent
    per_position: tuple[float, ...] = ()
    accepted_tokens: int | None = None
    drafted_tokens: int | None = None


@dataclass(frozen=True)
class DrafterInfo:
    """The server being followed is the drafter server (`<server unit>-drafter`), not the baseline."""
    unit: str
    loaded: bool = False  # this load's log said "Loading drafter model" (V1 runner) or gave Eagle3 aux layers (V2)
    aux_layers: tuple[int, ...] | None = None  # "Using [Eagle3] auxiliary layers from ...: (...)"
    log_stats: SpecLogStats | None = None


@dataclass(frozen=True)
class ServerInfo:
    phase: Phase = "unknown"
    progress: Progress | None = None
    eta_s: float | None = None
    eta_source: str | None = None  # "shards", "gpu_memory", "checkpoint_size", "previous_load"
    fraction: float | None = None  # 0..1 of the weight loading, from the best signal
    eta_ready_s: float | None = None  # to ready: the weights and every step after (eta_ready.py)
    eta_ready_confidence: str | None = None  # "previous_loads", or "low": no previous load, weights only
    eta_ready_basis: int = 0  # how many previous loads of the same model and settings it comes from
    model_id: str | None = None
    max_model_len: int | None = None
    version: str | None = None
    error: str | None = None
    reasoning_field: str | None = None  # set by the deep check
    deep_check: str | None = None
    metrics: ServerMetrics | None = None
    drafter: DrafterInfo | None = None  # None: the baseline server is the one followed


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class RunInfo:
    """One stage run found on the host (from its events.jsonl)."""
    stage: str
    run_id: str
    state: str  # running | done | failed | stopped | stale
    unit: str | None = None
    done: int = 0
    total: int = 0
    failed: int = 0
    rate: float | None = None
    eta_s: float | None = None
    last_event: dict[str, Any] | None = None
    series: dict[str, Any] | None = None  # train runs: curves and checkpoints (console/telemetry/train_view.py)
    skipped_lines: int = 0  # lines of its events.jsonl that were not events (a foreign or broken writer)
    started: float | None = None  # its latest start event's time (host clock): a resume starts it again
    host: dict[str, Any] | None = None  # the host's facts its start recorded (backend/kit/hostfacts.py), cleaned
    smoke: dict[str, Any] | None = None  # a generation's throughput smoke (backend/generate/smoke.py), cleaned


@dataclass(frozen=True)
class Snapshot:
    host: HostInfo
    service: ServiceInfo
    server: ServerInfo = field(default_factory=ServerInfo)
    gpus: tuple[GpuInfo, ...] = ()
    gpu_error: str | None = None
    runs: tuple[RunInfo, ...] = ()
    free_bytes: int | None = None  # on the work dir's volume
    taken_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
