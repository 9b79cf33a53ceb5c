"""One stage lifecycle for every host program; each program writes only its body.

    run lock        the run's lock (backend/kit/runlock.py), taken before the run directory is touched and
                    held for the program's life (its workers inherit it through `lock.pass_fds()`); a
                    run another program holds is refused: one line naming the holder, exit 2
    run directory   opened (or resumed, or archived with --fresh) for the program's manifest; a
                    refusal here is bad input: one line on stderr, exit 2, nothing created
    events          backend/contract/events.py's log, written through `emit`, which never takes a run down (a
                    failed write, a full disk above all, is said on stderr and the run goes on)
    signals         SIGTERM and SIGINT handled once, here (install_stop_handler, also for a program with
                    no run directory: the serve switch): the run is marked stopping, the program's
                    `on_stop` hooks run (forward to a child, set an asyncio event), and depending on the
                    mode the body is interrupted (`Stopped` raised where it is, outside `shielded()`
                    sections and event writes; or its task cancelled) or left to poll `stopping`.
                    Either way `finally` blocks run: a server swapped in is swapped back.
    start           `start(**data)` from the body (with the manifest and whether it resumed); a body that
                    ends before it gets one anyway, so every run reads as start ... finish
    body            the program's own work; it ends by returning, by raising `StageFailed` (or one of the
                    program's failure types), `Stopped`, or anything else (failed, with the type)
    summary.json    ALWAYS, also after a failure or a stop: the body's `summarize(status, error)`; a run
                    whose summary does not fit on a full disk fails (nothing can look its outputs up)
    finish          the finish event with the summary (compacted by the event log when the disk is full)
    exit code       backend/contract/exitcodes.py, from the final status

A full disk (ENOSPC/EDQUOT) anywhere in the body ends the run as failed with a message naming the full
volume; the event log's compact finish still says it when the whole one does not fit.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import sys
from typing import Any, Awaitable, Callable, Iterator, TypeGuard

from backend.contract import exitcodes
from backend.contract.events import EventLog
from backend.contract.runs import Manifest, RunDir, RunDirError, check_run_id, open_run_dir
from backend.kit.hostlock import LockHeld
from backend.kit.runlock import RunLock

SIGNALS = (signal.SIGTERM, signal.SIGINT)
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


class StageFailed(Exception):
    """The run cannot go on; the message says why and what to do (the one definition for every stage)."""


class ConfigError(ValueError):
    """Unusable arguments (the one definition for every stage's command line): exit 2, nothing created."""


class Stopped(BaseException):
    """A stop signal reached the body (a BaseException, so `except Exception` in the body never eats it)."""


def is_full_disk(exc: BaseException) -> TypeGuard[OSError]:
    return isinstance(exc, OSError) and exc.errno in FULL_DISK


def full_disk_message(exc: OSError, fallback: str) -> str:
    """A full disk, naming the volume that is full and what to do."""
    where = exc.filename if isinstance(exc.filename, str) and exc.filename else fallback
    return (f"disk full: no space left on the volume of {where} ({exc.strerror or exc}); free space there "
            f"(or move the work dir to a larger volume), then start the run again to resume")


def install_stop_handler(handler: Callable[[int], None],
                         loop: asyncio.AbstractEventLoop | None = None) -> Callable[[], None]:
    """SIGTERM and SIGINT to `handler(signum)` (through `loop` when given: there it may touch the loop);
    returns what puts the previous handlers back. The one place a host program sets them: a StageRun for
    a program with a run directory, this alone for one without (the serve switch)."""
    if loop is not None:
        for sig in SIGNALS:
            loop.add_signal_handler(sig, handler, sig)

        def restore_loop() -> None:
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)
        return restore_loop
    previous = {sig: signal.signal(sig, lambda signum, _frame: handler(signum)) for sig in SIGNALS}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)
    return restore


def ignore_hangups() -> None:
    """A program detached from the terminal that started it (the serve switch) outlives its SSH link."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def refuse(prog: str, message: object) -> int:
    """Bad input, said in one line before anything was created."""
    print(f"{prog}: {message}", file=sys.stderr)
    return exitcodes.BAD_INPUT


def _valid(run_id: str) -> bool:
    """A run id the lock can name; a bad one is refused by open_run_dir, naming what is expected."""
    try:
        check_run_id(run_id)
    except RunDirError:
        return False
    return True


class StageRun:
    """One run of one stage program. `mode`: "raise" (a signal raises Stopped in the body, outside
    shielded sections), "flag" (the body polls `stopping`/`check_stop()`; for bodies that forward the
    signal to a child or stop at safe points), or, for `arun`, "cancel" (the body's task is cancelled)."""

    def __init__(self, stage: str, run_id: str, *, work_dir: str, manifest: Manifest, fresh: bool = False,
                 prog: str | None = None, mode: str = "raise",
                 failures: tuple[type[BaseException], ...] = (),
                 stops: tuple[type[BaseException], ...] = ()):
        self.stage, self.run_id, self.work_dir = stage, run_id, work_dir
        self.manifest, self.fresh = manifest, fresh
        self.prog = prog or stage
        self.mode = mode
        self.failures = (StageFailed, *failures)
        self.stops = (Stopped, *stops)
        self.run_dir: RunDir | None = None
        self.lock = RunLock(work_dir, run_id, f"{self.prog} run {run_id}") if _valid(run_id) else None
        self.events: EventLog | None = None
        self.stopping: str | None = None  # the signal's name once one came
        self.started_event = False
        self.fatal_said = False
        self.summarize: Callable[[str, str | None], dict[str, Any]] | None = None
        self.report: Callable[[dict[str, Any]], str | None] | None = None
        self.stop_note = ""  # what the stop means for this program (said in the "received SIGTERM" event)
        self._hooks: list[Callable[[str], None]] = []
        self._shield = 0
        self._pending = False
        self._finishing = False
        self._noted = False
        self._restore: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        # the host's facts (backend/kit/hostfacts.py), in the start event and the summary; a body sets the
        # server's command line and the checkpoint it reads before its start
        self.host_facts: dict[str, Any] | None = None
        self.server_command: list[str] | None = None
        self.server_commands: dict[str, list[str]] | None = None  # by name, where it used several servers
        self.checkpoint: str | None = None

    # -- what the body uses ----------------------------------------------------------------------------
    @property
    def path(self) -> str:
        assert self.run_dir is not None
        return self.run_dir.path

    def file(self, name: str) -> str:
        assert self.run_dir is not None
        return self.run_dir.file(name)

    def emit(self, kind: str, **data: Any) -> None:
        """An event that never takes the run down (a full disk, a vanished directory): said on stderr."""
        if kind in ("error", "pause", "resume"):
            text = data.get("message") or data.get("reason") or data
            print(f"{self.prog}: {kind}: {text}", file=sys.stderr, flush=True)
        if kind == "error" and data.get("fatal"):
            if not self.started_event and self.run_dir is not None:
                self.start()  # every run reads start ... finish, also one that fails before its own start
            self.fatal_said = True
        if kind == "start":
            self.started_event = True
        if self.events is None:
            return
        with self.shielded():  # a signal never cuts an event line in two
            try:
                self.events.emit(kind, **data)
            except OSError as exc:
                print(f"{self.prog}: could not write the {kind} event: {exc}", file=sys.stderr, flush=True)

    def start(self, **data: Any) -> None:
        """The start event: the manifest and whether the run resumed, with the body's own keys."""
        assert self.run_dir is not None
        data.setdefault("manifest", self.run_dir.manifest.to_dict())
        data.setdefault("resumed", self.run_dir.resumed)
        if self.host_facts is None:  # provenance: the host's versions, driver, server command, checkpoint
            from backend.kit import hostfacts
            try:
                self.host_facts = hostfacts.collect(server_command=self.server_command, checkpoint=self.checkpoint,
                                                    servers=self.server_commands)
            except Exception as exc:  # noqa: BLE001 - facts missing must never stop a run
                self.host_facts = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        data.setdefault("host", self.host_facts)
        data.setdefault("total", 0)
        self.emit("start", **data)

    def on_stop(self, hook: Callable[[str], None]) -> None:
        """Called with the signal's name when one comes (forward it to a child, set an event...)."""
        self._hooks.append(hook)

    def check_stop(self) -> None:
        if self.stopping:
            raise Stopped(self.stopping)

    @contextlib.contextmanager
    def shielded(self) -> Iterator[None]:
        """A section a signal must not interrupt (a rename pair, an event write): Stopped is raised after it."""
        self._shield += 1
        try:
            yield
        finally:
            self._shield -= 1
        if self._shield == 0 and self._pending and not self._finishing:
            self._pending = False
            raise Stopped(self.stopping or "stop")

    def cancel_body(self) -> None:
        """For an async body that is not at a point where its own stop event helps: cancel its task."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    # -- signals ---------------------------------------------------------------------------------------
    def _signalled(self, signum: int, _frame: Any = None) -> None:
        name = signal.Signals(signum).name
        first = self.stopping is None
        self.stopping = self.stopping or name
        if self._finishing:
            return
        for hook in self._hooks:
            try:
                hook(name)
            except Exception as exc:  # a hook must never keep the stop from happening
                print(f"{self.prog}: stop hook failed: {exc}", file=sys.stderr)
        if self._loop is not None:  # in the event loop: writing an event here is safe
            self._note_stop()
            if self.mode == "cancel" and first:
                self.cancel_body()
            return
        if self.mode == "raise" and first:
            if self._shield:
                self._pending = True
            else:
                raise Stopped(name)

    def _note_stop(self) -> None:
        if self.stopping and not self._noted:
            self._noted = True
            note = f": {self.stop_note}" if self.stop_note else ": stopping"
            self.emit("error", fatal=False, message=f"received {self.stopping}{note}")

    def _install(self) -> None:
        self._restore = install_stop_handler(self._signalled, self._loop)

    def _uninstall(self) -> None:
        restore, self._restore = self._restore, None
        if restore is not None:
            restore()

    # -- the lifecycle ---------------------------------------------------------------------------------
    def _open(self) -> int | None:
        try:
            if self.lock is not None:  # before the directory is touched: --fresh archives it
                self.lock.acquire()
            self.run_dir = open_run_dir(self.work_dir, self.run_id, self.manifest, fresh=self.fresh)
            self.events = EventLog(self.run_dir.events_path, self.stage, self.run_id)
        except (RunDirError, LockHeld) as exc:
            self._release(forget=True)  # refused with nothing touched: nor does its lock file stay
            return refuse(self.prog, exc)
        except OSError as exc:
            self._release()
            if is_full_disk(exc):
                print(f"{self.prog}: {full_disk_message(exc, self.work_dir)}", file=sys.stderr)
                return exitcodes.FAILED
            raise
        return None

    def _release(self, forget: bool = False) -> None:
        """The run is ours no more (workers that still have the descriptor keep it until they exit)."""
        if self.lock is not None:
            self.lock.release(forget=forget)

    def _outcome(self, exc: BaseException | None) -> tuple[str, str | None]:
        if exc is None:
            return ("stopped", None) if self.stopping else ("completed", None)
        if isinstance(exc, self.stops) or (isinstance(exc, asyncio.CancelledError) and self.stopping):
            return "stopped", None
        if is_full_disk(exc):
            return "failed", full_disk_message(exc, self.path)  # type: ignore[arg-type]
        if isinstance(exc, self.failures):
            return "failed", str(exc)
        if isinstance(exc, KeyboardInterrupt):
            return "stopped", None
        return "failed", f"{type(exc).__name__}: {str(exc)[:1000]}"

    def _end(self, status: str, error: str | None) -> int:
        self._finishing = True  # a late signal changes nothing now
        if self.stopping:
            self._note_stop()
        summary: dict[str, Any] = {}
        if self.summarize is not None:
            try:
                summary = dict(self.summarize(status, error) or {})
            except Exception as exc:  # the summary must be written even when building it fails
                print(f"{self.prog}: could not build the summary: {type(exc).__name__}: {exc}", file=sys.stderr)
                summary = {}
        summary.setdefault("stage", self.stage)
        summary.setdefault("run_id", self.run_id)
        summary.setdefault("status", status)
        if error and "error" not in summary:
            summary["error"] = error
        status = summary["status"] if summary["status"] in exitcodes.STATUSES else "failed"
        error = summary.get("error") if isinstance(summary.get("error"), str) else error
        if not self.started_event:
            self.start()
        if self.host_facts is not None:
            summary.setdefault("host", self.host_facts)
        assert self.run_dir is not None
        try:
            self.run_dir.write_summary(summary)
        except OSError as exc:
            print(f"{self.prog}: could not write {self.run_dir.summary_path}: {exc}", file=sys.stderr)
            if is_full_disk(exc) and status != "failed":
                # no summary.json, no outputs anyone can look up: the run did not complete, the disk is full
                status, error = "failed", full_disk_message(exc, self.path)
                summary.update(status=status, error=error)
        if status == "failed" and error and not self.fatal_said:
            self.emit("error", message=error, fatal=True)
        self.emit("finish", status=status, summary=summary)
        if self.events is not None:
            self.events.close()
        if self.report is not None:
            try:
                text = self.report(summary)
            except Exception as exc:
                text = f"{self.prog}: {status} (the report failed: {type(exc).__name__}: {exc})"
            if text:
                print(text, flush=True)
        if error and status != "completed":
            print(f"{self.prog}: {status}: {error}", file=sys.stderr, flush=True)
        return exitcodes.for_status(status, slower=bool(summary.get("slower")))

    def run(self, body: Callable[["StageRun"], Any]) -> int:
        """A blocking body; its return value is ignored (the summary comes from `summarize`)."""
        refused = self._open()
        if refused is not None:
            return refused
        exc: BaseException | None = None
        try:
            self._install()
            try:
                body(self)
            except BaseException as e:  # noqa: BLE001 - every ending is said in the finish
                if isinstance(e, (SystemExit, GeneratorExit)):
                    raise
                exc = e
            finally:
                self._finishing = True
            status, error = self._outcome(exc)
            return self._end(status, error)
        finally:
            self._uninstall()
            self._release()

    async def arun(self, body: Callable[["StageRun"], Awaitable[Any]]) -> int:
        """An async body, run as a task in the running loop (signals reach it through the loop)."""
        refused = self._open()
        if refused is not None:
            return refused
        self._loop = asyncio.get_running_loop()
        exc: BaseException | None = None
        try:
            self._install()
            self._task = asyncio.ensure_future(body(self))
            try:
                await self._task
            except BaseException as e:  # noqa: BLE001
                if isinstance(e, (SystemExit, GeneratorExit)):
                    raise
                if isinstance(e, asyncio.CancelledError) and not self.stopping:
                    raise
                exc = e
            finally:
                self._finishing = True
            status, error = self._outcome(exc)
            return self._end(status, error)
        finally:
            self._uninstall()
            self._release()
