"""Everything the console knows about one host, refreshed by one probe per tick.

Sources: the probe (service state, GPU table, run directories, new event bytes, and for the tmux manager
the server's log file), the server's journal (one long-lived stream for a systemd unit), and HTTP
through a forwarded port. The result is a `Snapshot` that panes and `status --json` render alike.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import re
import time
from typing import AsyncIterator

import httpx

from console.profile import Profile
from console.telemetry.eta import LOADS_FILE, LoadRecord, estimate_load, last_load, parse_load_history
from console.host.base import AuthenticationFailed, Host, HostError, HostKeyError
from console.telemetry.snapshot import GpuInfo, HostInfo, RunInfo, ServerInfo, ServiceInfo, Snapshot
from console.parsers.journal import journal_follow_argv, parse_journal_json
from console.parsers.nvidia_smi import classify_gpu_error, parse_gpu_csv
from console.parsers.systemd import parse_systemctl_show
from console.parsers.tmux import tmux_status
from console.parsers.vllm_load import LoadTracker
from console.parsers.vllm_log import split_cr
from console.telemetry.probe import build_probe, parse_df, parse_listen, parse_runs_listing, split_sections
from console.telemetry.http_checks import HttpState, check_http, deep_check, fetch_metrics, model_mismatch, sim_text_backend
from console.telemetry.metrics_window import MetricsWindow
from console.telemetry.runs import RunBook

LOG_READ_MAX = 1 << 20
JOURNAL_BACKLOG = 3000  # lines read at connect: enough for a whole load sequence


def server_log_path(profile: Profile) -> str:
    """Where the tmux manager's server writes its output (tee'd from the pane)."""
    return f"{profile.paths.work_dir}/logs/{profile.server.unit}.log"


class Collector:
    def __init__(self, profile: Profile, host: Host, *, readonly: bool = False, clock=time.time):
        self.profile = profile
        self.host = host
        self.readonly = readonly
        self.clock = clock
        self.tracker = LoadTracker()
        self.history: list[LoadRecord] = []
        self.runbook = RunBook(profile.server.manager)
        self.metrics = MetricsWindow()
        self.checkpoint_bytes: int | None = None
        self.final_error: str | None = None  # set when connecting cannot succeed without the operator
        self.host_info = HostInfo(name=profile.host.name, simulated=profile.host.simulated)
        self.service = ServiceInfo(manager=profile.server.manager, unit=profile.server.unit)  # type: ignore[arg-type]
        self.gpus: list[GpuInfo] = []
        self.gpu_error: str | None = None
        self.free_bytes: int | None = None
        self.http = HttpState()
        self.port_listening: bool | None = None  # from the probe; None = could not tell
        self.deep: str | None = None
        self.reasoning_field: str | None = None
        self.journal_cursor: str | None = None
        self._fed_cursors: dict[str, None] = {}  # insertion-ordered, bounded
        self._log_offset: int | None = None
        self._client: httpx.AsyncClient | None = None
        self._forward: contextlib.AbstractAsyncContextManager | None = None
        self._recorded_start: float | None = None
        self._baseline_mib: float | None = None
        self._use_nvml = profile.host.transport == "local" and not profile.host.simulated
        self.nvml_note: str | None = None

    # -- connection ---------------------------------------------------------------------------------

    async def try_connect(self) -> bool:
        """Connect, recording why not in host_info. A refused key or host key is final: retrying it in a
        loop would only hammer sshd (and trip fail2ban); the operator has to act first."""
        try:
            await self.connect()
            return True
        except HostKeyError as e:
            hint = (" Check it with the host's owner, then run `eagle3-console trust-host --profile "
                    f"{self.profile.source or 'PROFILE'}` to accept it.") if not e.changed else ""
            self.final_error = f"{e}{hint}"
        except AuthenticationFailed as e:
            self.final_error = str(e)
        except HostError as e:
            self.host_info.reachable, self.host_info.error = False, str(e)
            return False
        self.host_info.reachable, self.host_info.error = False, self.final_error
        return False

    async def connect(self) -> None:
        await self.host.connect()
        self.host_info.reachable = True
        self.host_info.error = None
        hist = await self.host.read_from(f"{self.profile.paths.work_dir}/{LOADS_FILE}", 0)
        self.history = parse_load_history(hist.data.decode(errors="replace"))
        if self.checkpoint_bytes is None:
            self.checkpoint_bytes = await self._checkpoint_bytes()
        await self._prime_server_log()

    async def _checkpoint_bytes(self) -> int | None:
        """Size of the model's weight files on the host: over the GPU count, what each GPU will hold
        once loaded (the first load's progress signal, before any load was seen on this host)."""
        path = self.profile.server.model_path
        if not path.startswith("/"):
            return None  # a hub id: nothing on disk to measure
        argv = ["find", path, "-maxdepth", "1", "-type", "f", "(", "-name", "*.safetensors", "-o",
                "-name", "*.bin", "-o", "-name", "*.pt", ")", "-printf", "%s\n"]
        try:
            res = await self.host.run(argv, timeout=30)
        except HostError:
            return None
        if not res.ok:
            return None
        return sum(int(s) for s in res.stdout.split() if s.isdigit()) or None

    def expected_weights_gib(self) -> float | None:
        if self.profile.server.expected_weights_gib:
            return self.profile.server.expected_weights_gib
        gpus = self.profile.gpus.count or len(self.gpus)
        if self.checkpoint_bytes and gpus:
            return self.checkpoint_bytes / gpus / 2**30
        return None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._forward is not None:
            with contextlib.suppress(Exception):
                await self._forward.__aexit__(None, None, None)
            self._forward = None

    async def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._forward = self.host.forward_port(self.profile.server.port)
            local_port = await self._forward.__aenter__()
            # no retries at the transport: a refused connect is an answer (still loading)
            self._client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{local_port}", timeout=3.0,
                                             transport=httpx.AsyncHTTPTransport(retries=0))
        return self._client

    async def _drop_http(self) -> None:
        await self.close()

    # -- server log ---------------------------------------------------------------------------------

    async def _prime_server_log(self) -> None:
        if self.profile.server.manager == "systemd":
            argv = ["journalctl", "-u", self.profile.server.unit, "-a", "-o", "json", "--no-pager",
                    "-n", str(JOURNAL_BACKLOG)]
            res = await self.host.run(argv, timeout=60)
            for line in res.stdout.splitlines():
                self.feed_journal_line(line)
            if self.journal_cursor is None:
                await self._journal_tail_cursor()
        else:
            path = server_log_path(self.profile)
            head = await self.host.read_from(path, 0, 0)
            start = max(0, head.size - 4 * LOG_READ_MAX)
            chunk = await self.host.read_from(path, start, 4 * LOG_READ_MAX)
            self._log_offset = start
            self.feed_log_bytes(chunk.data, skip_first_partial=start > 0)

    async def _journal_tail_cursor(self) -> None:
        """The unit has no entries yet: follow from the journal's current end instead.

        `journalctl -u UNIT -f -n N` started while UNIT has no entries drops the first burst the unit
        then writes (seen in the systemd rig, systemd 252: a unit's first six lines never arrived), so
        the follow starts after the journal-wide last cursor, where the -u match then applies."""
        res = await self.host.run(["journalctl", "-o", "json", "-n", "1", "--no-pager"], timeout=30)
        for line in res.stdout.splitlines():
            entry = parse_journal_json(line)
            if entry is not None and entry.cursor:
                self.journal_cursor = entry.cursor

    def feed_journal_line(self, line: str) -> str | None:
        entry = parse_journal_json(line)
        if entry is None:
            return None
        self.journal_cursor = entry.cursor or self.journal_cursor
        if not self._already_fed(entry.cursor):
            self.tracker.feed(entry.message, entry.ts)
        return entry.message

    def _already_fed(self, cursor: str | None) -> bool:
        """True for a journal entry the tracker has had (the catch-up read and the stream can both bring
        it); a repeated start-of-load line would otherwise reset a finished load."""
        if cursor is None:
            return False
        if cursor in self._fed_cursors:
            return True
        self._fed_cursors[cursor] = None
        if len(self._fed_cursors) > 2 * JOURNAL_BACKLOG:
            del self._fed_cursors[next(iter(self._fed_cursors))]
        return False

    def feed_log_bytes(self, data: bytes, *, skip_first_partial: bool = False) -> list[str]:
        """Log-file bytes (tmux manager): complete lines go to the tracker. The unfinished last line is
        fed too but not consumed (it is read again next time), because a tqdm bar redraws with '\r' and
        gets its newline only at the very end."""
        end = data.rfind(b"\n") + 1
        if self._log_offset is not None:
            self._log_offset += end
        lines = data[:end].decode(errors="replace").split("\n")[:-1]
        if skip_first_partial and lines:
            lines = lines[1:]
        now = self.clock()
        out = []
        for line in lines:
            msg = split_cr(line)
            self.tracker.feed(msg, now)
            out.append(msg)
        partial = data[end:].decode(errors="replace")
        if partial:
            self.tracker.feed(split_cr(partial), now)
        return out

    async def follow_journal(self, unit: str | None = None, *, feed_tracker: bool = True) -> AsyncIterator[str]:
        """Follow a unit's journal for ever, resuming from the last cursor after a drop (no duplicates, no
        gaps). Lines of the server unit also go to the load tracker unless another follower does that."""
        unit = unit or self.profile.server.unit
        is_server = feed_tracker and unit == self.profile.server.unit
        cursor = self.journal_cursor if is_server else None
        delay = 0.5
        while self.final_error is None:
            argv = journal_follow_argv(unit, cursor=cursor, lines=0 if cursor else 200)
            try:
                async for line in self.host.stream(argv):
                    entry = parse_journal_json(line)
                    if entry is None:
                        continue
                    cursor = entry.cursor or cursor
                    if is_server:
                        self.journal_cursor = cursor
                        if not self._already_fed(entry.cursor):
                            self.tracker.feed(entry.message, entry.ts)
                    delay = 0.5
                    yield entry.message
            except (AuthenticationFailed, HostKeyError) as e:
                self.final_error = str(e)
            except HostError:
                pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    # -- refresh ------------------------------------------------------------------------------------

    async def refresh(self) -> Snapshot:
        started = time.monotonic()
        try:
            await self._probe()
            self.host_info.reachable = True
            self.host_info.error = None
            self.host_info.rtt_ms = round((time.monotonic() - started) * 1000, 1)
        except HostError as e:
            self.host_info.reachable = False
            self.host_info.error = str(e)
            if isinstance(e, (AuthenticationFailed, HostKeyError)):
                self.final_error = str(e)  # the reconnect was refused: stop knocking
            await self._drop_http()
            return self.snapshot()
        await self._check_http()
        await self._remember_load()
        return self.snapshot()

    async def _probe(self) -> None:
        events = self.runbook.reads_wanted()
        pending_units = self.runbook.pending_units()
        log = None
        if self.profile.server.manager == "tmux" and self._log_offset is not None:
            log = (server_log_path(self.profile), self._log_offset)
        if self._use_nvml:
            self._read_nvml()
        argv, plan = build_probe(self.profile, events=events, stage_units=pending_units,
                                 server_log=log, listen_port=self.profile.server.port, gpus=not self._use_nvml)
        res = await self.host.run(argv, timeout=30)
        sections = split_sections(res.stdout, plan)
        # the server's last log lines before the service state: once the tracker hears "down" it
        # ignores failure lines as teardown noise, so the root cause must be in first
        if "server_log" in sections:
            self.feed_log_bytes(sections["server_log"].text.encode())
        self._apply_service(sections.get("service"))
        if self._down_without_cause():
            await self._catch_up_journal()
        self._stop_tracker_if_down()
        self._apply_gpus(sections.get("gpus"))
        self.port_listening = parse_listen(sections["listen"].text) if "listen" in sections else None
        if "disk" in sections:
            self.free_bytes = parse_df(sections["disk"].text)
        for i, ev in enumerate(events):
            sec = sections.get(f"events:{i}")
            if sec is not None:
                self.runbook.apply_events(ev.run_dir, sec.text.encode())
        if "stage_units" in sections:
            self.runbook.apply_unit_states(sections["stage_units"].text, pending_units)
        if "runs" in sections:
            self.runbook.apply_listing(parse_runs_listing(sections["runs"].text))

    def _apply_service(self, sec) -> None:
        if sec is None:
            return
        if self.profile.server.manager == "systemd":
            info = parse_systemctl_show(sec.text)
            info.unit = self.profile.server.unit
            info.since_ts = parse_systemd_timestamp(info.since)
        else:
            ok = sec.rc == 0
            info = tmux_status(self.profile.server.unit, sec.rc, "" if ok else sec.text,
                               sec.text if ok else None).service
        self.service = info

    def _down_without_cause(self) -> bool:
        return (self.service.active_state in ("inactive", "failed")
                and self.tracker.phase not in ("stopped", "failed", "unknown"))

    async def _catch_up_journal(self) -> None:
        """The unit is down but the journal stream has not brought its last lines yet (the probe can
        see the exit first): read what journald holds now, so a failed load keeps its root cause."""
        if self.profile.server.manager != "systemd":
            return
        argv = ["journalctl", "-u", self.profile.server.unit, "-a", "-o", "json", "--no-pager"]
        argv += [f"--after-cursor={self.journal_cursor}"] if self.journal_cursor else ["-n", str(JOURNAL_BACKLOG)]
        res = await self.host.run(argv, timeout=30)
        for line in res.stdout.splitlines():
            self.feed_journal_line(line)

    def _stop_tracker_if_down(self) -> None:
        if self._down_without_cause():
            self.tracker.stop(self.clock())

    def _read_nvml(self) -> None:
        """The console runs on the GPU host: NVML directly, no nvidia-smi process per tick. Without a
        usable NVML (no driver here, a container without the library) use the profile's command."""
        from console.telemetry.nvml import read_gpus
        gpus, err = read_gpus()
        if err:
            self._use_nvml = False
            self.nvml_note = err
        else:
            self.gpus, self.gpu_error = gpus, None

    def _apply_gpus(self, sec) -> None:
        if sec is None:
            return
        err = classify_gpu_error(sec.rc if sec.rc is not None else 0, sec.text, "")
        if err:
            self.gpus, self.gpu_error = [], err
        else:
            self.gpus, self.gpu_error = parse_gpu_csv(sec.text), None

    async def _check_http(self) -> None:
        if self.service.active_state not in ("active", "activating", "reloading"):
            self.http = HttpState()
            return
        if self.port_listening is False:
            self.http = HttpState()  # still loading: nothing to ask, and no channel spent asking
            return
        try:
            client = await self._http()
            self.http = await check_http(client, self.profile)
            if self.profile.host.simulated and self.http.health == 200 and self.host_info.sim_text is None:
                self.host_info.sim_text = await sim_text_backend(client)
            if self.http.health == 200 and self.metrics.due(self.clock()):
                text = await fetch_metrics(client)
                if text is not None:
                    self.metrics.feed(text, self.clock(), self.http.model_id)
        except (HostError, OSError) as e:
            self.http = HttpState(error=f"port forward failed: {e}")
            await self._drop_http()

    async def _remember_load(self) -> None:
        """Append a finished load to the host's history once, for the next load's ETA."""
        t = self.tracker
        # HTTP answering ends the load even when the log's last lines have not arrived yet
        if (not self.http.listening or self.http.health != 200 or t.load_started_ts is None
                or self._recorded_start == t.load_started_ts):
            return
        self._recorded_start = t.load_started_ts
        ready = t.ready_ts if t.ready_ts is not None else self.clock()
        rec = LoadRecord(model=self.profile.server.model_id, started=t.load_started_ts, ready=ready,
                         weights_gib=t.weights_gib, weights_s=t.weights_seconds, baseline_mib=self._baseline_mib)
        if any(abs(r.ready - rec.ready) < 1 and r.model == rec.model for r in self.history):
            return
        self.history.append(rec)
        if self.readonly:
            return
        path = f"{self.profile.paths.work_dir}/{LOADS_FILE}"
        script = 'mkdir -p "$(dirname "$1")" && printf "%s\\n" "$2" >> "$1"'
        with contextlib.suppress(HostError):
            await self.host.run(["sh", "-c", script, "sh", path, rec.to_line()], timeout=15)

    # -- the snapshot -------------------------------------------------------------------------------

    def server_info(self) -> ServerInfo:
        t = self.tracker
        info = ServerInfo(phase=t.phase, progress=t.progress, model_id=self.http.model_id,
                          max_model_len=self.http.max_model_len, version=self.http.version or t.version,
                          reasoning_field=self.reasoning_field, deep_check=self.deep)
        active = self.service.active_state in ("active", "activating", "reloading")
        if not active:
            if self.service.active_state == "unknown" and not self.host_info.reachable:
                info.phase = "unknown"
            elif t.phase == "failed" or self.service.active_state == "failed":
                info.phase = "failed"
                info.error = t.error or f"service {self.service.active_state} ({self.service.result or 'no result'})"
            else:
                info.phase = "stopped"
            return info
        if self.http.listening and self.http.health == 200:
            info.phase = "ready"
            info.metrics = self.metrics.current
            info.progress = t.progress
            wrong = model_mismatch(self.profile, self.http.model_id)
            if wrong:
                info.phase, info.error = "failed", wrong
            elif self.http.error:
                info.error = self.http.error
            return info
        if self.http.listening and self.http.health is not None:
            info.phase = "failed" if t.phase in ("ready", "unknown") else t.phase
            info.error = self.http.error
            return info
        if t.phase == "failed":
            info.error = t.error
            return info
        if t.phase in ("ready", "unknown"):
            # the log says up but nothing listens (yet): the socket opens a few ms after the log line
            info.phase = "starting_api" if t.phase == "ready" else "starting"
        if info.phase in ("starting", "loading_weights"):
            self._estimate(info)
        return info

    def _estimate(self, info: ServerInfo) -> None:
        t = self.tracker
        if self._baseline_mib is None and info.phase == "starting":
            used = [g.memory_used_mib for g in self.gpus if g.memory_used_mib is not None]
            self._baseline_mib = sum(used) / len(used) if used else None
        start = t.load_started_ts
        if start is None and self.service.since_ts is not None:
            start = self.service.since_ts
        elapsed = self.clock() - start if start else None
        est = estimate_load(
            elapsed_s=elapsed,
            shards=(t.progress.done, t.progress.total) if t.progress else None,
            shard_eta_s=t.shard_eta_s,
            shards_live=self.profile.server.manager == "tmux",
            gpus=self.gpus, expected_weights_gib=self.expected_weights_gib(),
            baseline_mib=self._baseline_mib,
            previous=last_load(self.history, self.profile.server.model_id))
        info.eta_s = None if est.eta_s is None else round(est.eta_s, 1)
        info.eta_source = est.source
        info.fraction = None if est.fraction is None else round(est.fraction, 4)

    @property
    def runs(self) -> dict:
        return self.runbook.tracks

    def settled(self) -> bool:
        return self.runbook.settled()

    def run_infos(self) -> list[RunInfo]:
        return self.runbook.infos()

    def snapshot(self) -> Snapshot:
        return Snapshot(host=self.host_info, service=self.service, server=self.server_info(),
                        gpus=self.gpus, gpu_error=self.gpu_error, runs=self.run_infos(),
                        free_bytes=self.free_bytes, taken_at=self.clock())

    async def run_deep_check(self) -> str:
        client = await self._http()
        result = await deep_check(client, self.profile)
        self.deep = ("ok: " if result.ok else "FAILED: ") + result.message
        self.reasoning_field = result.reasoning_field
        return self.deep


_SYSTEMD_TS = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\s+(UTC|GMT))?")


def parse_systemd_timestamp(text: str | None) -> float | None:
    """`Mon 2026-11-30 05:04:29 UTC` -> unix seconds; other zones are read as the console's local time."""
    if not text:
        return None
    m = _SYSTEMD_TS.search(text)
    if not m:
        return None
    dt = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
    if m.group(2):
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()
