"""The one server switch: which vLLM server holds the GPUs, changed one careful step at a time.

Every program that puts another server in the baseline's place (extract, online train, online verify, the
bench pair, the console's serve switches) runs a `SwitchPlan` through `Switch`:

    go(B)     stop whatever plan server runs (the baseline, or another drafter), SEE IT DOWN (its unit or
              session gone, within `stop_check_s`), SEE ITS GPUS FREE (backend/kit/gpu_free.py: no compute
              process on B's GPUs and their memory near idle, within `gpu_free_s`: the driver can take
              seconds to release a large server's memory, and vLLM refuses to start until it has), start B, wait until it answers /health and lists a
              model in /v1/models (a server that exits while loading is named with the end of its log)
    back()    ALWAYS, also after a failure or a stop: stop the servers this switch started (seen down), start
              the home server (the baseline) again; a home server that will not start is a fatal error
              naming the command. `keep_home_down` (the pipeline holds the baseline down across its stages)
              leaves it to the caller.

The host's server lock (backend/kit/serverlock.py) is taken before the first stop and dropped after back():
a second program that would switch servers is refused, naming the holder. Every step, its command and
outcome, and when the home server went down and came back, reach the program's events through the
`progress` and `emit` callbacks, and `SwitchRecord` keeps them for the summary.

`python -m backend.kit.switch --plan P --to NAME` runs one switch on its own (the console's serve-drafter and
serve-baseline): detached with --detach, so a lost SSH link never leaves the GPUs without a server; when B
does not come up, the home server is started again.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

from backend.contract import exitcodes
from backend.contract.numbers import finite
from backend.contract.plans import PlanError, argv_list
from backend.contract.runs import read_json_object
from backend.kit import gpu_free, hostfacts
from backend.kit.lifecycle import ignore_hangups, install_stop_handler, refuse
from backend.kit.redact import redacted_text
from backend.kit.redact import shown as redacted_shown
from backend.kit.serverlock import LockHeld, ServerLock

SWITCH_VERSION = 1
BASELINE_HELD_ENV = "E3_BASELINE_HELD"  # a pipeline keeps the baseline down across its stages: leave it down
LOG_CHECK_S = 30.0  # the alive and log-tail commands' own time limit
DEFAULT_STOP_CHECK_S = 60.0
TIMEOUT_MAX_S = 86400.0  # the profile's timeouts go to a day at most (console/profile.py)


class SwitchPlanError(ValueError):
    """The plan is unusable; the message names the file and the key."""


class SwitchFailed(Exception):
    """The switch (or the server it brought up) failed; the message says why and what to do."""


class SwitchStopped(Exception):
    """A stop was asked for while switching in."""


def tail(text: str | bytes, lines: int = 3, width: int = 400) -> str:
    """The last few non-empty lines of a command's output, on one line, bounded."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-width:]


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# -- the plan ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerSpec:
    """One server the switch may run: how the service manager starts, stops and checks it."""
    name: str                      # baseline, extractor, drafter, third: the steps are stop_<name>, start_<name>
    unit: str                      # its systemd unit or tmux session
    start: list[str]
    stop: list[str]
    alive: list[str] | None = None     # exits 0 while its unit/session runs; None: cannot tell
    log_tail: list[str] | None = None  # prints the end of its log
    command: list[str] = field(default_factory=list)  # the server's own command line, shown
    gpus: list[int] = field(default_factory=list)     # the GPU indices it holds (empty: unknown)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "start": self.start, "stop": self.stop, "alive": self.alive,
                "log_tail": self.log_tail, "command": self.command, "gpus": self.gpus}


@dataclass(frozen=True)
class SwitchPlan:
    """The home server (the baseline, always brought back) and the servers a program switches to, all
    answering at one endpoint (they take turns on the same GPUs and port)."""
    home: ServerSpec
    away: list[ServerSpec]
    endpoint: str
    ready_timeout_s: float
    command_timeout_s: float = 300.0
    stop_check_s: float = DEFAULT_STOP_CHECK_S
    lock_path: str = ""  # the host's server lock (backend/kit/serverlock.py); empty: no lock (tests)
    nvidia_smi: list[str] = field(default_factory=list)  # how the GPUs are asked; empty: nvidia-smi
    gpu_free_s: float = gpu_free.DEFAULT_FREE_TIMEOUT_S  # after a stop, the next start waits this long at most
    gpu_idle_mib: int = gpu_free.DEFAULT_IDLE_MIB  # a GPU using more than this is not free yet

    @property
    def health_url(self) -> str:
        return f"{self.endpoint}/health"

    @property
    def models_url(self) -> str:
        return f"{self.endpoint}/v1/models"

    def server(self, name: str) -> ServerSpec:
        for s in (self.home, *self.away):
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"version": SWITCH_VERSION, "home": self.home.to_dict(), "away": [s.to_dict() for s in self.away],
                "endpoint": self.endpoint, "ready_timeout_s": self.ready_timeout_s,
                "command_timeout_s": self.command_timeout_s, "stop_check_s": self.stop_check_s,
                "lock_path": self.lock_path, "nvidia_smi": self.nvidia_smi, "gpu_free_s": self.gpu_free_s,
                "gpu_idle_mib": self.gpu_idle_mib}


def _argv(where: str, data: dict[str, Any], key: str, *, required: bool) -> list[str] | None:
    try:
        return argv_list(data.get(key), f"{where}: {key}", required=required)  # the one argv check of a plan
    except PlanError as exc:
        raise SwitchPlanError(str(exc)) from None


def _seconds(where: str, data: dict[str, Any], key: str, default: float | None) -> float:
    value = data.get(key, default)
    number = finite(value)
    if number is None or not 0 < number <= TIMEOUT_MAX_S:
        raise SwitchPlanError(f"{where}: {key} must be a positive number of seconds (finite, at most "
                              f"{TIMEOUT_MAX_S:g}), got {value!r}")
    return float(number)


def server_from_dict(data: Any, where: str) -> ServerSpec:
    if not isinstance(data, dict):
        raise SwitchPlanError(f"{where}: expected an object (a server)")
    name = data.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise SwitchPlanError(f"{where}: name must be a word (baseline, extractor, drafter), got {name!r}")
    gpus = data.get("gpus") or []
    if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus):
        raise SwitchPlanError(f"{where}: gpus must be a list of GPU indices, got {str(gpus)[:80]}")
    command = data.get("command") or []
    if not isinstance(command, list) or not all(isinstance(v, str) for v in command):
        raise SwitchPlanError(f"{where}: command must be a list of strings")
    return ServerSpec(name=name, unit=str(data.get("unit") or ""),
                      start=_argv(where, data, "start", required=True) or [],
                      stop=_argv(where, data, "stop", required=True) or [],
                      alive=_argv(where, data, "alive", required=False),
                      log_tail=_argv(where, data, "log_tail", required=False), command=list(command), gpus=list(gpus))


def switch_from_dict(data: Any, path: str = "<plan>") -> SwitchPlan:
    if not isinstance(data, dict):
        raise SwitchPlanError(f"{path}: the server switch must be a JSON object")
    if data.get("version") != SWITCH_VERSION:
        raise SwitchPlanError(f"{path}: switch version {data.get('version')!r} is not {SWITCH_VERSION}: the console "
                              f"and the backend on the host differ; start it from the console again")
    away = data.get("away")
    if not isinstance(away, list):  # empty: only the home server is stopped and started (a pipeline's hold)
        raise SwitchPlanError(f"{path}: away must be a list of servers")
    home = server_from_dict(data.get("home"), f"{path}: home")
    servers = [server_from_dict(s, f"{path}: away[{i}]") for i, s in enumerate(away)]
    names = [home.name, *(s.name for s in servers)]
    if len(set(names)) != len(names):
        raise SwitchPlanError(f"{path}: the servers' names repeat ({', '.join(names)})")
    endpoint = data.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise SwitchPlanError(f"{path}: endpoint must be an http(s) URL, got {endpoint!r}")
    lock = data.get("lock_path") or ""
    if not isinstance(lock, str) or (lock and not lock.startswith("/")):
        raise SwitchPlanError(f"{path}: lock_path must be an absolute path, got {lock!r}")
    smi = _argv(path, data, "nvidia_smi", required=False) or []
    idle = data.get("gpu_idle_mib", gpu_free.DEFAULT_IDLE_MIB)
    if not isinstance(idle, int) or isinstance(idle, bool) or idle < 0:
        raise SwitchPlanError(f"{path}: gpu_idle_mib must be a whole number of MiB >= 0, got {idle!r}")
    return SwitchPlan(home=home, away=servers, endpoint=endpoint.rstrip("/"), nvidia_smi=smi, gpu_idle_mib=idle,
                      gpu_free_s=_seconds(path, data, "gpu_free_s", gpu_free.DEFAULT_FREE_TIMEOUT_S),
                      ready_timeout_s=_seconds(path, data, "ready_timeout_s", None),
                      command_timeout_s=_seconds(path, data, "command_timeout_s", 300.0),
                      stop_check_s=_seconds(path, data, "stop_check_s", DEFAULT_STOP_CHECK_S), lock_path=lock)


def load_switch(path: str) -> SwitchPlan:
    return switch_from_dict(read_json_object(path, SwitchPlanError, f"--plan {path}: no such file"), path)


# -- what it did ------------------------------------------------------------------------------------------
@dataclass
class StepRecord:
    step: str
    command: str
    rc: int | None
    ok: bool
    seconds: float
    output: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class SwitchRecord:
    """What the switch did, for the summary and the console: which steps ran and how they ended, and when
    the baseline (the home server) went down and came back."""
    steps: list[StepRecord] = field(default_factory=list)
    baseline_stopped: bool = False
    baseline_restarted: bool | None = None  # None: never stopped, nothing to bring back
    baseline_down_at: float | None = None   # unix seconds
    baseline_up_at: float | None = None     # its start command returned

    def to_dict(self) -> dict[str, Any]:
        return {"steps": [s.to_dict() for s in self.steps], "baseline_stopped": self.baseline_stopped,
                "baseline_restarted": self.baseline_restarted, "baseline_down_at": self.baseline_down_at,
                "baseline_up_at": self.baseline_up_at}


def describe(record: dict[str, Any]) -> str:
    """A switch of a summary on one line, as the stages print it."""
    steps = ", ".join(f"{s['step']} {'ok' if s['ok'] else 'FAILED'}" for s in record["steps"])
    state = {True: "started again", False: "NOT started again", None: "untouched"}[record["baseline_restarted"]]
    return f"swap: {steps or 'nothing run'}; baseline {state}"


def _noop(*_args: Any, **_kw: Any) -> None:
    return None


def default_holder() -> str:
    """Who this program is, for the server lock's refusal: `python -m backend.extract in e3-extract-ID`."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    if os.path.basename(argv0) == "__main__.py":  # run with -m: name the package
        parts = os.path.normpath(os.path.dirname(argv0)).split(os.sep)
        top = parts.index("backend") if "backend" in parts else len(parts) - 1
        argv0 = "python -m " + ".".join(parts[top:])
    unit = os.environ.get("E3_UNIT", "")
    return f"{argv0}" + (f" in {unit}" if unit else "")


# -- running it -------------------------------------------------------------------------------------------
class Switch:
    """Runs a SwitchPlan (see the module docstring). `stopped()` is polled while starting a server: a stop
    asked for then ends the wait (SwitchStopped) and back() brings the baseline back."""

    def __init__(self, plan: SwitchPlan, *, holder: str = "", progress: Callable[..., None] = _noop,
                 emit: Callable[..., None] = _noop, stopped: Callable[[], bool] = lambda: False,
                 health_interval: float = 1.0, keep_home_down: bool = False):
        self.plan = plan
        self.holder = holder or default_holder()
        self.progress, self.emit, self.stopped = progress, emit, stopped
        self.health_interval = health_interval
        self.keep_home_down = keep_home_down
        self.record = SwitchRecord()
        self.lock = ServerLock(plan.lock_path, self.holder) if plan.lock_path else None
        self.on_started: Callable[[str], None] = _noop  # called once a server's start command returned
        self.started: list[str] = []  # the away servers this switch started (stopped again by back())
        self.current: str | None = None  # the server this switch last brought up
        self.max_model_len: int | None = None  # what the server reports in /v1/models
        self.model_id: str | None = None
        self.freeing: str | None = None  # the server last seen down, whose GPUs may not be released yet
        self.port_checked = False

    # -- commands ------------------------------------------------------------------------------------
    async def _exec(self, argv: list[str], timeout: float) -> tuple[int | None, str]:
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as exc:  # the command itself is missing
            return None, f"{type(exc).__name__}: {exc}"
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
            return proc.returncode, tail(err or out)
        except asyncio.TimeoutError:
            kill_group(proc.pid)
            await proc.wait()
            return None, f"timed out after {timeout:g} s"

    async def step(self, name: str, argv: list[str], phase: str) -> bool:
        shown = redacted_shown(argv)  # events and summaries never hold a unit's secret (Environment=, --api-key)
        self.progress(phase, force=True, step=name, command=shown)
        t0 = time.monotonic()
        rc, output = await self._exec(argv, self.plan.command_timeout_s)
        output = redacted_text(output)  # a failing start may echo its command line
        record = StepRecord(step=name, command=shown, rc=rc, ok=rc == 0,
                            seconds=round(time.monotonic() - t0, 2), output=output)
        self.record.steps.append(record)
        self.progress(phase, force=True, swap=record.to_dict())
        if not record.ok:
            self.emit("error", fatal=False, message=f"{name} failed (exit {rc}): {output or 'no output'}; "
                      f"command: {record.command}")
        return record.ok

    async def alive(self, server: ServerSpec) -> bool | None:
        """Whether its unit or session runs; None when the plan has no way to tell."""
        if not server.alive:
            return None
        try:
            proc = await asyncio.create_subprocess_exec(*server.alive, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.DEVNULL)
            return await asyncio.wait_for(proc.wait(), LOG_CHECK_S) == 0
        except (OSError, asyncio.TimeoutError):
            return None

    def _home_down(self) -> None:
        if self.record.baseline_down_at is None:
            self.record.baseline_down_at = round(time.time(), 3)
            self.progress("baseline_down", force=True, baseline="down", at=self.record.baseline_down_at)

    async def stop_server(self, server: ServerSpec) -> None:
        """Stop `server` and see it down; SwitchFailed when it still runs."""
        if server.name == self.plan.home.name:
            self.record.baseline_restarted = False  # from here on the baseline must be brought back
        ok = await self.step(f"stop_{server.name}", server.stop, f"stopping_{server.name}")
        deadline = time.monotonic() + self.plan.stop_check_s
        while await self.alive(server):
            if time.monotonic() > deadline:
                raise SwitchFailed(f"the {server.name} server ({server.unit}) still runs {self.plan.stop_check_s:g} s "
                                   f"after its stop: nothing else was started on its GPUs")
            await asyncio.sleep(0.2)
        if not ok and await self.alive(server) is None:
            raise SwitchFailed(f"could not stop the {server.name} server ({self.record.steps[-1].output}); the "
                               f"GPUs were not handed to another server")
        self.freeing = server.name
        if server.name == self.plan.home.name:
            self.record.baseline_stopped = True
            self._home_down()
        if server.name in self.started:
            self.started.remove(server.name)
        if self.current == server.name:
            self.current = None

    def _take_lock(self) -> None:
        if self.lock is not None and not self.lock.held:
            try:
                self.lock.acquire()
            except LockHeld as exc:
                raise SwitchFailed(str(exc)) from None
            except OSError as exc:
                raise SwitchFailed(f"cannot take the server lock {self.plan.lock_path}: {exc.strerror}") from None

    async def check_port(self) -> None:
        """SwitchFailed before anything is stopped when a leftover server holds the endpoint's port (backend/
        kit/hostfacts.leftover_on_port): the server this switch starts could not bind it, and the baseline
        would be down for nothing. Asked once per switch, before its first stop."""
        if self.port_checked:
            return
        self.port_checked = True
        port = urlsplit(self.plan.endpoint).port
        if port is None:
            return
        servers = [self.plan.home, *self.plan.away]
        states = [await self.alive(s) for s in servers]
        down = True if all(a is False for a in states) else False if any(states) else None
        # a process's systemd service names it only where the servers are systemd units
        units = [s.unit for s in servers] if any("systemctl" in a for a in self.plan.home.stop) else None
        why = await asyncio.to_thread(hostfacts.leftover_on_port, port, units=units, servers_down=down)
        if why:
            self.progress("leftover_server", force=True, port=port, why=why)
            raise SwitchFailed(hostfacts.leftover_message(port, why))

    async def go(self, name: str) -> None:
        """Put server `name` on the GPUs (see the module docstring)."""
        target = self.plan.server(name)
        if self.stopped():
            raise SwitchStopped()
        self._take_lock()
        await self.check_port()
        for other in (self.plan.home, *self.plan.away):
            if other.name == name:
                continue
            # a server this switch started is stopped unasked (another drafter in the same unit); any other
            # one when its check says it runs or cannot tell (a stop of a stopped unit is harmless)
            if other.name in self.started or await self.alive(other) is not False:
                await self.stop_server(other)
            if self.stopped():
                raise SwitchStopped()
        if self.current != name and await self.alive(target):
            self.current = name  # it runs already (the baseline before a bench): taken as it is
        if self.current != name:
            if name == self.plan.home.name:
                if not await self._start_home():
                    raise SwitchFailed(f"could not start the {name} server: {self.record.steps[-1].output}")
            else:
                free, why = await self.wait_gpus_free(target)
                if not free:
                    raise SwitchFailed(why)
                if not await self.step(f"start_{name}", target.start, f"starting_{name}"):
                    raise SwitchFailed(f"could not start the {name} server: {self.record.steps[-1].output}")
                self.started.append(name)
            self.current = name
        self.on_started(name)
        await self.wait_ready(target)

    async def wait_gpus_free(self, target: ServerSpec) -> tuple[bool, str]:
        """After a stop, until `target`'s GPUs (every GPU when the plan does not say) are free; (False, why,
        naming the holders) when they are not within the plan's gpu_free_s."""
        gone, self.freeing = self.freeing, None
        if gone is None:
            return True, ""
        smi = self.plan.nvidia_smi or ["nvidia-smi"]
        shown = f"GPU {','.join(map(str, target.gpus))}" if target.gpus else "every GPU"
        if not gpu_free.available(smi):
            self.progress("gpus_unchecked", force=True, server=target.name,
                          why=f"{smi[0]} not found: cannot see whether the {gone} server's memory was released")
            return True, ""
        self.progress("waiting_for_gpus", force=True, server=target.name, gpus=list(target.gpus))
        free, waited, holders = await gpu_free.wait_free(smi, target.gpus, timeout_s=self.plan.gpu_free_s,
                                                         idle_mib=self.plan.gpu_idle_mib)
        if free:
            self.progress("gpus_free", force=True, server=target.name, gpus=list(target.gpus),
                          waited_s=round(waited, 2))
            return True, ""
        return False, (f"{shown} still held {waited:.0f} s after the {gone} server stopped ({holders}); the "
                       f"{target.name} server was not started on them: stop what holds them, or raise "
                       f"gpu_free_s in the plan")

    async def _start_home(self) -> bool:
        home = self.plan.home
        free, why = await self.wait_gpus_free(home)
        if not free:  # started anyway: the baseline coming back matters more; its own error says the rest
            self.emit("error", fatal=False, message=why.replace("was not started on them", "is started anyway"))
        ok = await self.step(f"start_{home.name}", home.start, f"starting_{home.name}")
        if self.record.baseline_restarted is not None or ok:
            self.record.baseline_restarted = ok
        if ok:
            self.record.baseline_up_at = round(time.time(), 3)
            self.progress("baseline_up", force=True, baseline="up", at=self.record.baseline_up_at,
                          down_s=round(self.record.baseline_up_at - self.record.baseline_down_at, 1)
                          if self.record.baseline_down_at else None)
        else:
            self.emit("error", fatal=True, message=f"the {home.name} server could not be started again: "
                      f"{self.record.steps[-1].output}; start it by hand: {self.record.steps[-1].command}")
        return ok

    async def back(self, *, wait: bool = False) -> None:
        """Always: the servers this switch started go, the home server comes back (unless kept down).
        A stop signal now changes nothing. `wait`: until the home server answers."""
        try:
            for name in list(reversed(self.started)):
                try:
                    await self.stop_server(self.plan.server(name))
                except SwitchFailed as exc:
                    self.emit("error", fatal=True, message=f"{exc}; the {self.plan.home.name} server was NOT started "
                              f"beside it: stop {self.plan.server(name).unit} by hand, then start the "
                              f"{self.plan.home.name}")
                    return
            if self.record.baseline_stopped and not self.keep_home_down and self.current != self.plan.home.name:
                if await self._start_home():
                    self.current = self.plan.home.name
                    if wait:
                        try:
                            await self.wait_ready(self.plan.home, stoppable=False)
                        except SwitchFailed as exc:
                            self.emit("error", fatal=True, message=str(exc))
        finally:
            if self.lock is not None:
                self.lock.release()

    # -- watching ------------------------------------------------------------------------------------
    async def http_ok(self, url: str, *, want_models: bool = False) -> bool:
        import aiohttp

        try:
            timeout = aiohttp.ClientTimeout(total=5)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(url) as resp:
                    if resp.status != 200:
                        return False
                    if not want_models:
                        return True
                    body = json.loads((await resp.content.read(1 << 20)).decode() or "null")
                    if not (isinstance(body, dict) and isinstance(body.get("data"), list) and body["data"]):
                        return False
                    card = body["data"][0] if isinstance(body["data"][0], dict) else {}
                    limit = card.get("max_model_len")
                    self.max_model_len = limit if isinstance(limit, int) and not isinstance(limit, bool) else None
                    self.model_id = card.get("id") if isinstance(card.get("id"), str) else None
                    return True
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return False

    async def answers(self) -> bool:
        """It answers /health and lists a model in /v1/models (recording its max_model_len)."""
        return await self.http_ok(self.plan.health_url) and await self.http_ok(self.plan.models_url, want_models=True)

    async def why_dead(self, server: ServerSpec) -> str:
        """The end of the server's log, when the plan says how to read it."""
        if not server.log_tail:
            return "its unit or session is gone"
        try:
            proc = await asyncio.create_subprocess_exec(*server.log_tail, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT)
            out, _ = await asyncio.wait_for(proc.communicate(), LOG_CHECK_S)
        except (OSError, asyncio.TimeoutError):
            return "its log could not be read"
        lines = [l for l in out.decode(errors="replace").splitlines() if l.strip()]
        errors = [l for l in lines if " ERROR " in l or "Error" in l or "error" in l]
        return "last log lines: " + tail("\n".join(errors or lines), 2, 300)

    async def wait_ready(self, server: ServerSpec, *, stoppable: bool = True, ready_phase: str = "") -> None:
        t0 = time.monotonic()
        plan = self.plan
        while True:
            if stoppable and self.stopped():
                raise SwitchStopped()
            if await self.answers():
                self.progress(ready_phase or f"{server.name}_ready", force=True, server=server.name,
                              ready_after_s=round(time.monotonic() - t0, 1))
                return
            if await self.alive(server) is False:
                raise SwitchFailed(f"the {server.name} server exited while starting ({await self.why_dead(server)})")
            waited = time.monotonic() - t0
            if waited > plan.ready_timeout_s:
                raise SwitchFailed(f"the {server.name} server did not answer {plan.health_url} and {plan.models_url} "
                                   f"within {plan.ready_timeout_s:g} s ({await self.why_dead(server)})")
            self.progress(f"waiting_for_{server.name}", waited_s=round(waited, 1))
            deadline = time.monotonic() + min(1.0, self.health_interval)
            while time.monotonic() < deadline and not (stoppable and self.stopped()):
                await asyncio.sleep(0.1)


# -- the console's serve switches, on their own -----------------------------------------------------------
def _events(path: str, name: str) -> Any:
    from backend.contract.events import EventLog

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return EventLog(path, "switch", name)


async def serve(plan: SwitchPlan, to: str, events_path: str, report: Callable[[str], None] = _noop) -> int:
    """Put `to` on the GPUs and leave it serving; when it does not come up, the home server is started
    again (unless `to` is the home server: then there is nothing to fall back on). 0 serving, 1 failed."""
    log = _events(events_path, f"serve-{to}") if events_path else None
    stopping = False

    def emit(kind: str, **data: Any) -> None:
        print(f"switch: {kind}: {json.dumps(data)[:600]}", file=sys.stderr, flush=True)
        if log is not None:
            try:
                log.emit(kind, **data)
            except OSError:
                pass

    def on_signal(_signum: int) -> None:
        nonlocal stopping
        stopping = True

    # the lifecycle's one SIGTERM/SIGINT handling; no run directory here (the events go to --events)
    restore = install_stop_handler(on_signal, asyncio.get_running_loop())
    sw = Switch(plan, holder=f"serve-{to} switch", progress=lambda phase, force=False, **kw: emit(
        "progress", phase=phase, **kw), emit=emit, stopped=lambda: stopping)
    sw.on_started = lambda name: report(f"started {name}")
    # provenance: the host's facts and the command line of the server it puts up (backend/kit/hostfacts.py)
    try:
        facts = hostfacts.collect(server_command=plan.server(to).command or None)
    except Exception as exc:  # noqa: BLE001 - facts missing must never stop a switch
        facts = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    emit("start", to=to, home=plan.home.name, host=facts)
    status, error = "completed", None
    try:
        await sw.go(to)
        if to != plan.home.name:
            sw.started.clear()  # it stays: serving is the point
    except (SwitchFailed, SwitchStopped) as exc:
        status = "stopped" if isinstance(exc, SwitchStopped) else "failed"
        error = str(exc) or "stopped while the server started"
        report(f"failed {error}")
    finally:
        try:
            if status != "completed" and to != plan.home.name:
                await sw.back()
            elif sw.lock is not None:
                sw.lock.release()
        finally:
            restore()
    emit("finish", status=status, summary={"to": to, "status": status, "error": error, **sw.record.to_dict()})
    if log is not None:
        log.close()
    # a stopped switch did not put its server up: FAILED, not a stop's COMPLETED (the console reads 1)
    return exitcodes.COMPLETED if status == "completed" else exitcodes.FAILED


def _detach(log_path: str) -> tuple[str | None, Callable[[str], None]]:
    """Go on in a new session with output to `log_path`. The caller's side gets (what the switch said,
    _noop): it waits until the switch says its server started (or why it failed before that). The
    detached side gets (None, report): `report` tells the caller once. A caller that is gone (the SSH
    link dropped) changes nothing on the detached side."""
    read_fd, write_fd = os.pipe()
    if os.fork() > 0:
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            said = pipe.read(4096).decode(errors="replace").strip()
        return said, _noop
    os.close(read_fd)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    ignore_hangups()
    told = [False]

    def report(text: str) -> None:
        if told[0]:
            return
        told[0] = True
        try:
            os.write(write_fd, text.encode()[:4000] + b"\n")
            os.close(write_fd)
        except OSError:
            pass  # the caller is gone: go on

    return None, report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.kit.switch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True, help="the switch plan JSON (SwitchPlan.to_dict)")
    p.add_argument("--to", required=True, help="the server to put on the GPUs (a name in the plan)")
    p.add_argument("--events", default="", help="append the switch's events to this JSONL file")
    p.add_argument("--detach", metavar="LOG", default="",
                   help="check the plan and the lock, then go on in the background writing to LOG")
    a = p.parse_args(argv)
    try:
        plan = load_switch(a.plan)
        plan.server(a.to)
    except SwitchPlanError as exc:
        return refuse("switch", exc)
    except KeyError:
        return refuse("switch", f"--to {a.to!r} is not a server of {a.plan}")
    if plan.lock_path:  # refused now, in the foreground, when another program switches the servers
        try:
            ServerLock(plan.lock_path, "check").acquire().release()
        except LockHeld as exc:  # FAILED, not BAD_INPUT: the console has always read 1 here
            print(f"switch: {exc}", file=sys.stderr)
            return exitcodes.FAILED
    report: Callable[[str], None] = _noop
    if a.detach:
        said, report = _detach(a.detach)
        if said is not None:  # the caller's side: the switch goes on detached
            if said.startswith("started "):
                print(f"switch: {said}; it goes on detached (log {a.detach}): waiting until it answers, the "
                      f"{plan.home.name} started again if it does not")
                return exitcodes.COMPLETED
            print(f"switch: {said.removeprefix('failed ') or 'ended without saying why: see ' + a.detach}",
                  file=sys.stderr)
            return exitcodes.FAILED
    try:
        return asyncio.run(serve(plan, a.to, a.events, report))
    finally:
        report("failed the switch ended before its server started")


if __name__ == "__main__":
    raise SystemExit(main())
