"""What the Textual app needs from the rest of the console (the app never touches SSH itself).

`console.ui.app.ConsoleApp` takes a Controller. The real one (console/live.py) wires collectors and the
host layer; tests pass a fake. Every mutating method returns the exact remote command(s) it ran so the
app can show them (command log) and tests can assert on them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Protocol

from console.telemetry.snapshot import Snapshot

STAGES: tuple[str, ...] = ("serve", "generate", "extract", "train", "verify", "serve_drafter", "bench")


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    message: str
    commands: tuple[str, ...] = ()  # shell-quoted remote commands, as run


@dataclass(frozen=True)
class JournalLine:
    text: str
    unit: str
    ts: float | None = None


class Controller(Protocol):
    profile_name: str
    host_name: str
    simulated: bool
    readonly: bool

    def snapshots(self) -> AsyncIterator[Snapshot]:
        """Yield a fresh Snapshot about once a second, forever (reconnecting as needed)."""
        ...

    def journal(self, unit: str) -> AsyncIterator[JournalLine]:
        """Follow the log of `unit` (server unit or a stage's unit), resuming after reconnects."""
        ...

    async def start_stage(self, stage: str) -> ActionResult: ...

    async def stop_stage(self, stage: str) -> ActionResult: ...

    async def restart_server(self) -> ActionResult: ...

    async def deep_check(self) -> ActionResult: ...

    async def close(self) -> None:
        """Release connections; never stops anything on the host."""
        ...
