"""Everything the console knows about one host, refreshed by one probe per tick.

Sources: the probe (service state, GPU table, run directories, new event bytes, and for the tmux manager
the server's log file), the server's log (server_log.py: the journal for a systemd unit, fed by the
session's one stream), and HTTP through a forwarded port. `snapshot()` turns them into a frozen
`Snapshot` that panes and `status --json` render alike; the phase itself is decided by phase.py.

Nothing here loops or retries on its own: the session (console/session.py) drives it.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import re
import time

import httpx

from console import naming
from console.host.base import AuthenticationFailed, Host, HostError, HostKeyError
from console.parsers.journal import parse_journal_json
from console.parsers.nvidia_smi import classify_gpu_error, parse_gpu_csv
from console.parsers.systemd import parse_systemctl_show
from console.parsers.tmux import tmux_status
from console.profile import Profile
from console.telemetry import phase as phases
from console.telemetry.eta_ready import (STEPS, comparable, estimate_ready, settings_key, step_durations,
                                         weights_elapsed)
from console.telemetry.eta import LOADS_FILE, LoadRecord, estimate_load, last_load, parse_load_history
from console.telemetry.http_checks import HttpState, check_http, deep_check, demo_engine_text, \
    fetch_metrics, model_mismatch, sim_text_backend
from console.telemetry.metrics_window import MetricsWindow
from console.telemetry.probe import SERVER_LOG_READ_MAX, build_probe, parse_df, parse_listen, parse_runs_listing, \
    split_sections
from console.telemetry.runs import RunBook
from console.telemetry.sanitize import sanitized
from console.telemetry.server_log import JOURNAL_BACKLOG, ServerLog
from console.snapshot import (DrafterInfo, GpuInfo, HostInfo, RunInfo, ServerInfo, ServiceInfo, Snapshot,
                                        SpecLogStats)

PRIME_LOG_BYTES = 4 * SERVER_LOG_READ_MAX  # tmux: how much of the log's tail is read at connect
PROBE_TIMEOUT_S = 30.0
# What a conversion of the host's answer can raise; caught per probe section (Collector._unreadable_guard)
UNREADABLE = (TypeError, ValueError, ArithmeticError, LookupError, AttributeError, RecursionError,
              UnicodeError)


class Collector:
    def __init__(self, profile: Profile, host: Host, *, readonly: bool = False, clock=time.time):
        self.profile = profile
        self.host = host
        self.readonly = readonly
        self.clock = clock
        self.log = ServerLog()
        self.history: list[LoadRecord] = []
        self.runbook = RunBook(profile.server.manager)
        self.metrics = MetricsWindow()
        self.checkpoint_bytes: int | None = None
        self.final_error: str | None = None  # set when connecting cannot succeed without the operator
        self.reachable = False
        self.error: str | None = None
        self.rtt_ms: float | None = None
        self.sim_text: str | None = None
        self.sim_engine = False  # the demo's server is vLLM's own CPU build, not the stand-in
        # which server the telemetry follows: the baseline, or the drafter server when that is the one
        # running (drafter_server.SERVERS); the log, metrics and checks are of that server only
        self.active = "baseline"
        self._primed = True  # connect() primes the log; a switch of server primes it again
        self.service = ServiceInfo(manager=profile.server.manager, unit=profile.server.unit)
        self.gpus: tuple[GpuInfo, ...] = ()
        self.gpu_error: str | None = None
        self.free_bytes: int | None = None
        self.http = HttpState()
        # when the question behind `http` was asked (monotonic): the ready check runs beside a probe
        # that may still be under way, and the newer question's answer wins (_answer_http)
        self._http_asked_at = time.monotonic()
        self._probe_started = self._http_asked_at
        self.port_listening: bool | None = None  # from the probe; None = could not tell
        self.deep: str | None = None
        self.reasoning_field: str | None = None
        self._client: httpx.AsyncClient | None = None
        self._forward: contextlib.AbstractAsyncContextManager | None = None
        self._client_lock = asyncio.Lock()  # a probe's check and the ready check share one forward
        self._recorded_start: float | None = None
        self._baseline_mib: float | None = None
        self._use_nvml = profile.host.transport == "local" and not profile.host.simulated
        self.nvml_note: str | None = None
        self.unreadable: dict[str, int] = {}  # probe sections skipped because their answer was unreadable
        self.unreadable_note: str | None = None  # the last such skip, for the operator

    @property
    def tracker(self):
        return self.log.tracker

    @property
    def server_unit(self) -> str:
        return naming.server_unit(self.profile, self.active)

    def follow_server(self, which: str) -> None:
        """Follow `which` server from now on: its unit, its log from its current run, its metrics."""
        if which == self.active:
            return
        self.active = which
        self.log = ServerLog()
        self.metrics = MetricsWindow()
        self._answer_http(HttpState(), time.monotonic())  # the other server's answers are not this one's
        self.deep = self.reasoning_field = None
        self._baseline_mib = None
        self.service = ServiceInfo(manager=self.profile.server.manager, unit=self.server_unit)
        self._primed = False

    # -- connection ---------------------------------------------------------------------------------

    async def try_connect(self) -> bool:
        """Connect, recording why not. A refused key or host key is final: retrying it in a loop would
        only hammer sshd (and trip fail2ban); the operator has to act first."""
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
            self.reachable, self.error = False, str(e)
            return False
        self.reachable, self.error = False, self.final_error
        return False

    async def connect(self) -> None:
        await self.host.connect()
        self.reachable, self.error = True, None
        hist = await self.host.read_from(f"{self.profile.paths.work_dir}/{LOADS_FILE}", 0)
        history = parse_load_history(hist.data.decode(errors="replace"))
        self.history = history
        if history.skipped:
            self.unreadable["loads"] = history.skipped
            self.unreadable_note = (f"loads: {history.skipped} unreadable record(s) in "
                                    f"{LOADS_FILE} skipped")
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
        async with self._client_lock:
            if self._client is None:
                self._forward = self.host.forward_port(self.profile.server.port)
                local_port = await self._forward.__aenter__()
                # no retries at the transport: a refused connect is an answer (still loading)
                self._client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{local_port}", timeout=3.0,
                                                 transport=httpx.AsyncHTTPTransport(retries=0))
            return self._client

    # -- server log ---------------------------------------------------------------------------------

    async def _prime_server_log(self) -> None:
        self._primed = True
        unit = self.server_unit
        if self.profile.server.manager == "systemd":
            # the unit's current invocation first, so only its lines reach the load tracker
            script = ('inv=$(systemctl show "$1" -p InvocationID --value 2>/dev/null); echo "$inv"; '
                      'journalctl -u "$1" -a -o json --no-pager -n "$2"')
            res = await self.host.run(["sh", "-c", script, "sh", unit, str(JOURNAL_BACKLOG)], timeout=60)
            first, _, rest = res.stdout.partition("\n")
            entries = [e for e in map(parse_journal_json, rest.splitlines()) if e is not None]
            self.log.feed_backlog(entries, first.strip() or None)
            if self.log.cursor is None:
                await self._journal_tail_cursor()
        else:
            path = naming.server_log(self.profile, self.active)
            head = await self.host.run(["stat", "-L", "-c", "%i %s", path], timeout=30)
            inode, size = _inode_size(head.stdout if head.ok else "")
            start = max(0, size - PRIME_LOG_BYTES)
            chunk = await self.host.read_from(path, start, PRIME_LOG_BYTES)
            self.log.prime_log(inode, chunk.size, chunk.data, start, self.clock())

    async def _journal_tail_cursor(self) -> None:
        """The unit has no entries yet: follow from the journal's current end instead.

        `journalctl -u UNIT -f -n N` started while UNIT has no entries drops the first burst the unit
        then writes (seen in the systemd rig, systemd 252), so the follow starts after the journal-wide
        last cursor, where the -u match then applies."""
        self.log.cursor = await journal_tail_cursor(self.host)

    def feed_journal_line(self, line: str) -> str | None:
        """One line of the server unit's `journalctl -o json` stream; returns its message."""
        entry = parse_journal_json(line)
        if entry is None:
            return None
        self.log.feed_entry(entry)
        return entry.message

    # -- refresh ------------------------------------------------------------------------------------

    async def refresh(self) -> Snapshot:
        try:
            if not self._primed:
                await self._prime_server_log()
            self._probe_started = time.monotonic()
            elapsed = await self._probe()
            if not self._primed:  # the probe found the other server running: its log from its start
                await self._prime_server_log()
            self.reachable, self.error = True, None
            # the probe's own round trip: reconnecting or waiting for a channel is not the link's speed
            self.rtt_ms = round(elapsed * 1000, 1) if elapsed is not None else None
        except HostError as e:
            self.reachable, self.error = False, str(e)
            if isinstance(e, (AuthenticationFailed, HostKeyError)):
                self.final_error = str(e)  # the reconnect was refused: stop knocking
            await self.close()
            return self.snapshot()
        await self._check_http()
        decision = self._decision()
        if not decision.serving:
            self.deep = self.reasoning_field = None  # a check of an earlier run says nothing of this one
        if decision.phase == "starting" and self._baseline_mib is None:
            used = [g.memory_used_mib for g in self.gpus if g.memory_used_mib is not None]
            self._baseline_mib = sum(used) / len(used) if used else None  # memory in use before the load
        await self._remember_load()
        return self.snapshot()

    async def ask_ready(self) -> bool:
        """The log says the API server is starting or ready: ask /health and /v1/models now rather than
        at the next probe, even while a probe is under way (its answers are older: they lose to this
        one, _answer_http). The unit's state is not asked: the line came from its running invocation.
        True when the port answered."""
        await self._ask_http(extras=False)
        if self.http.listening and self.service.active_state not in phases.ACTIVE_STATES:
            # the last probe ran before the start: the line came from the unit's running invocation and its
            # port answers, so "inactive" is older news (the next probe brings the unit's own word)
            self.service = dataclasses.replace(self.service, active_state="active", sub_state="running")
        return self.http.listening

    async def _probe(self) -> float | None:
        events = self.runbook.reads_wanted()
        pending_units = self.runbook.pending_units()
        log = None
        if self.profile.server.manager == "tmux" and self.log.log_offset is not None:
            log = (naming.server_log(self.profile, self.active), self.log.log_read_from())
        if self._use_nvml:
            self._read_nvml()
        other = "drafter" if self.active == "baseline" else "baseline"
        argv, plan = build_probe(self.profile, events=events, stage_units=pending_units,
                                 server_log=log, listen_port=self.profile.server.port, gpus=not self._use_nvml,
                                 server=(self.server_unit, naming.server_log(self.profile, self.active)),
                                 other_server=(naming.server_unit(self.profile, other), naming.server_log(self.profile, other)))
        res = await self.host.run(argv, timeout=PROBE_TIMEOUT_S, errors="surrogateescape")
        sections = split_sections(res.stdout, plan)
        guard = self._unreadable_guard
        with guard("service"):
            if self._other_took_over(sections.get("service"), sections.get("other_service"), other):
                sections.pop("server_log", None)  # the other server's log is read from its start instead
            else:
                self._apply_service(sections.get("service"))
        # the server's last log lines before deciding it is down: once the tracker hears "down" it
        # ignores failure lines as teardown noise, so the root cause must be in first
        if "server_log" in sections:
            with guard("server_log"):
                head, _, data = sections["server_log"].data.partition(b"\n")
                inode, size = _inode_size(head.decode(errors="replace"))
                self.log.feed_log(inode, size, data, self.clock(), limit=SERVER_LOG_READ_MAX)
        if self._down_without_cause():
            await self._catch_up_journal()
        if self._down_without_cause():
            self.tracker.stop(self.clock())
        with guard("gpus"):
            self._apply_gpus(sections.get("gpus"))
        self.port_listening = parse_listen(sections["listen"].text) if "listen" in sections else None
        if "disk" in sections:
            self.free_bytes = parse_df(sections["disk"].text)
        # the listing first: the probe stats the files before it reads them, so a run that wrote
        # meanwhile has read bytes beyond its listed size, which read the other way round looks like a
        # file replaced by a shorter one (the run vanished for a tick and was read again from 0)
        if "runs" in sections:
            with guard("runs"):
                self.runbook.apply_listing(parse_runs_listing(sections["runs"].text))
        for i, ev in enumerate(events):
            sec = sections.get(f"events:{i}")
            if sec is not None:
                with guard("events"):
                    self.runbook.apply_events(ev.run_dir, sec.data, ev.limit, offset=ev.offset)
        if "stage_units" in sections:
            with guard("stage_units"):
                self.runbook.apply_unit_states(sections["stage_units"].text, pending_units)
        return res.elapsed_s

    @contextlib.contextmanager
    def _unreadable_guard(self, section: str):
        """The parsers are total and the conversions after them too; this is the net for a shape nobody
        foresaw in what the host sent: that section of this probe is skipped and counted, the console
        goes on (one bad value never blinds it)."""
        try:
            yield
        except UNREADABLE as exc:
            self.unreadable[section] = self.unreadable.get(section, 0) + 1
            self.unreadable_note = f"{section}: {type(exc).__name__}: {exc}"[:200]

    def _service_info(self, sec, unit: str) -> ServiceInfo:
        if self.profile.server.manager == "systemd":
            info = parse_systemctl_show(sec.text)
            return dataclasses.replace(info, unit=unit, since_ts=parse_systemd_timestamp(info.since))
        ok = sec.rc == 0
        return tmux_status(unit, sec.rc, "" if ok else sec.text, sec.text if ok else None).service

    def _other_took_over(self, sec, other_sec, other: str) -> bool:
        """The server not followed runs and the followed one does not (it was swapped outside this
        console, or by an earlier one): follow the other from now on. Both down: stay (a failed
        drafter server keeps showing its failure)."""
        if sec is None or other_sec is None:
            return False
        mine = self._service_info(sec, self.server_unit)
        theirs = self._service_info(other_sec, naming.server_unit(self.profile, other))
        if theirs.active_state not in phases.ACTIVE_STATES or mine.active_state in phases.ACTIVE_STATES:
            return False
        self.follow_server(other)
        self.service = theirs
        return True

    def _apply_service(self, sec) -> None:
        if sec is None:
            return
        info = self._service_info(sec, self.server_unit)
        if self.profile.server.manager == "systemd" and self.log.begin_invocation(info.invocation):
            self.new_run(self._probe_started)
        self.service = info

    def new_run(self, seen_at: float) -> None:
        """A new run of the server unit (the probe's InvocationID, or the journal stream's first line of
        it; `seen_at` monotonic): what the earlier process answered says nothing of this one. An ask that
        asked later still wins (_answer_http)."""
        self._answer_http(HttpState(), seen_at)
        self.deep = self.reasoning_field = None

    def _down_without_cause(self) -> bool:
        return (self.service.active_state in ("inactive", "failed")
                and self.tracker.phase not in ("stopped", "failed", "unknown"))

    async def _catch_up_journal(self) -> None:
        """The unit is down but the journal stream has not brought its last lines yet (the probe can
        see the exit first): read what journald holds now, so a failed load keeps its root cause."""
        if self.profile.server.manager != "systemd":
            return
        argv = ["journalctl", "-u", self.server_unit, "-a", "-o", "json", "--no-pager"]
        argv += [f"--after-cursor={self.log.cursor}"] if self.log.cursor else ["-n", str(JOURNAL_BACKLOG)]
        res = await self.host.run(argv, timeout=30)
        for line in res.stdout.splitlines():
            self.feed_journal_line(line)

    def _read_nvml(self) -> None:
        """The console runs on the GPU host: NVML directly, no nvidia-smi process per tick. Without a
        usable NVML (no driver here, a container without the library) use the profile's command."""
        from console.telemetry.nvml import read_gpus
        gpus, err = read_gpus()
        if err:
            self._use_nvml = False
            self.nvml_note = err
        else:
            self.gpus, self.gpu_error = tuple(gpus), None

    def _apply_gpus(self, sec) -> None:
        if sec is None:
            return
        err = classify_gpu_error(sec.rc if sec.rc is not None else 0, sec.text, "")
        if err:
            self.gpus, self.gpu_error = (), err
        else:
            self.gpus, self.gpu_error = tuple(parse_gpu_csv(sec.text)), None

    def _answer_http(self, state: HttpState, asked_at: float) -> None:
        """Newest question wins: a probe's "not listening" (asked when the probe started) never undoes
        what a ready check that asked later found, whichever of the two answers last."""
        if asked_at >= self._http_asked_at:
            self.http, self._http_asked_at = state, asked_at

    async def _check_http(self, *, extras: bool = True) -> None:
        if self.service.active_state not in phases.ACTIVE_STATES:
            self._answer_http(HttpState(), self._probe_started)  # the unit's state: the probe's news
            return
        if self.port_listening is False:
            # still loading (the probe's news): nothing to ask, and no channel spent asking
            self._answer_http(HttpState(), self._probe_started)
            if self._client is None:  # but the client ready (an SSL context costs ~0.2 s), for the ready check
                with contextlib.suppress(HostError, OSError):
                    await self._http()
            return
        await self._ask_http(extras=extras)

    async def _ask_http(self, *, extras: bool) -> None:
        asked = time.monotonic()
        try:
            client = await self._http()
            self._answer_http(await check_http(client, self.profile), asked)
            if not extras:
                return  # the ready ask: /health and /v1/models only; the next tick brings the rest
            if self.profile.host.simulated and self.http.health == 200 and self.sim_text is None:
                self.sim_text = await sim_text_backend(client, self.http.version)
                self.sim_engine = self.sim_text is not None and self.http.version is not None \
                    and self.sim_text == demo_engine_text(self.http.version)
            if self.http.health == 200 and self.metrics.due(self.clock()):
                text = await fetch_metrics(client)
                if text is not None:
                    # a huge exposition parses in a thread: the event loop keeps drawing meanwhile
                    with self._unreadable_guard("metrics"):
                        await asyncio.to_thread(self.metrics.feed, text, self.clock(), self.http.model_id)
        except (HostError, OSError) as e:
            self._answer_http(HttpState(error=f"port forward failed: {e}"), asked)
            await self.close()

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
                         weights_gib=t.weights_gib, weights_s=t.weights_seconds, baseline_mib=self._baseline_mib,
                         settings=self.load_settings(), phases=step_durations(t.phase_started, ready) or None)
        if rec.ready <= rec.started or any(abs(r.ready - rec.ready) < 1 and r.model == rec.model
                                           for r in self.history):
            return  # (a load seen only once ready measured nothing: parse_load_history drops it too)
        self.history.append(rec)
        if self.readonly:
            return
        path = f"{self.profile.paths.work_dir}/{LOADS_FILE}"
        script = 'mkdir -p "$(dirname "$1")" && printf "%s\\n" "$2" >> "$1"'
        with contextlib.suppress(HostError):
            await self.host.run(["sh", "-c", script, "sh", path, rec.to_line()], timeout=15)

    # -- the snapshot -------------------------------------------------------------------------------

    def _decision(self) -> phases.PhaseDecision:
        t = self.tracker
        return phases.decide(phases.PhaseInputs(
            # a refused configuration leaves no failure marker, only a traceback and the exit: decide()
            # shows the log's cause once the unit has failed, so pass it whatever the log's phase
            log_phase=t.phase, log_error=t.error or t.cause, unit_state=self.service.active_state,
            unit_result=self.service.result, host_reachable=self.reachable,
            http_listening=self.http.listening, http_health=self.http.health, http_error=self.http.error,
            model_mismatch=model_mismatch(self.profile, self.http.model_id)))

    def server_info(self) -> ServerInfo:
        t = self.tracker
        decision = self._decision()
        info = ServerInfo(phase=decision.phase, error=decision.error, progress=t.progress,
                          model_id=self.http.model_id, max_model_len=self.http.max_model_len,
                          version=self.http.version or t.version, reasoning_field=self.reasoning_field,
                          deep_check=self.deep, metrics=self.metrics.current if decision.serving else None,
                          drafter=self.drafter_info())
        if decision.estimate_load:
            info = self._estimate(info)
        if decision.phase in STEPS:
            ready = estimate_ready(phase=decision.phase, phase_started=t.phase_started, now=self.clock(),
                                   weights_eta_s=info.eta_s,
                                   history=comparable(self.history, self.profile.server.model_id,
                                                      self.load_settings()))
            info = dataclasses.replace(info, eta_ready_s=ready.eta_s, eta_ready_confidence=ready.confidence,
                                       eta_ready_basis=ready.basis)
        return info

    def load_settings(self) -> str:
        srv = self.profile.server
        return settings_key(self.active, srv.model_path, srv.vllm_args, srv.command)

    def drafter_info(self) -> DrafterInfo | None:
        if self.active != "drafter":
            return None
        t = self.tracker
        st = t.spec_stats
        log_stats = None if st is None else SpecLogStats(
            mean_acceptance_length=st.mean_acceptance_length, acceptance_pct=st.acceptance_pct,
            per_position=tuple(st.per_position), accepted_tokens=st.accepted_tokens,
            drafted_tokens=st.drafted_tokens)
        return DrafterInfo(unit=self.server_unit, loaded=t.drafter_loaded, aux_layers=t.aux_layers,
                           log_stats=log_stats)

    def _estimate(self, info: ServerInfo) -> ServerInfo:
        t = self.tracker
        elapsed = weights_elapsed(t.phase, t.phase_started, self.clock(), t.load_started_ts or self.service.since_ts)
        est = estimate_load(
            elapsed_s=elapsed,
            shards=(t.progress.done, t.progress.total) if t.progress else None,
            shard_eta_s=t.shard_eta_s,
            shards_live=self.profile.server.manager == "tmux",
            gpus=list(self.gpus), expected_weights_gib=self.expected_weights_gib(),
            baseline_mib=self._baseline_mib,
            previous=(comparable(self.history, self.profile.server.model_id, self.load_settings()) or
                      [last_load(self.history, self.profile.server.model_id)])[0])
        return dataclasses.replace(info, eta_s=None if est.eta_s is None else round(est.eta_s, 1),
                                   eta_source=est.source,
                                   fraction=None if est.fraction is None else round(est.fraction, 4))

    def settled(self) -> bool:
        return self.runbook.settled()

    def run_infos(self) -> tuple[RunInfo, ...]:
        return tuple(self.runbook.infos())

    def host_info(self, *, not_answering_since: float | None = None, error: str | None = None) -> HostInfo:
        return HostInfo(name=self.profile.host.name, reachable=self.reachable and not_answering_since is None,
                        error=error or self.error, rtt_ms=self.rtt_ms, simulated=self.profile.host.simulated,
                        sim_text=self.sim_text, sim_engine=self.sim_engine, not_answering_since=not_answering_since,
                        unreadable=sum(self.unreadable.values()), unreadable_note=self.unreadable_note)

    def snapshot(self, *, not_answering_since: float | None = None, error: str | None = None) -> Snapshot:
        """The current facts as one frozen value, every remote string cleaned (telemetry/sanitize.py).

        `not_answering_since`: the session's refresh has not answered since then; the values are the
        last known ones."""
        return sanitized(Snapshot(
            host=self.host_info(not_answering_since=not_answering_since, error=error),
            service=self.service, server=self.server_info(), gpus=self.gpus, gpu_error=self.gpu_error,
            runs=self.run_infos(), free_bytes=self.free_bytes, taken_at=self.clock()))

    async def run_deep_check(self) -> str:
        client = await self._http()
        result = await deep_check(client, self.profile)
        self.deep = ("ok: " if result.ok else "FAILED: ") + result.message
        self.reasoning_field = result.reasoning_field
        return self.deep


async def journal_tail_cursor(host: Host) -> str | None:
    """The journal's last cursor, host-wide: a follow that starts after it sees every later line."""
    res = await host.run(["journalctl", "-o", "json", "-n", "1", "--no-pager"], timeout=30)
    cursor = None
    for line in res.stdout.splitlines():
        entry = parse_journal_json(line)
        if entry is not None and entry.cursor:
            cursor = entry.cursor
    return cursor


def _inode_size(text: str) -> tuple[str, int]:
    bits = text.split()
    if len(bits) >= 2 and bits[1].isdigit():
        return bits[0], int(bits[1])
    return "0", 0


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
