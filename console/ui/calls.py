"""A call when it matters: a load finished or failed, a stage completed or failed, while the operator
looks elsewhere. Three channels, each on or off in [notify] (profile, then the user config):
the terminal bell, a tmux `display-message` when the console runs inside tmux ($TMUX), and a notify
command of the operator's own (an argv list, run on this machine, given the event as JSON on stdin).
--readonly changes nothing here: watching is what read-only is for.

Every text here comes from a sanitized snapshot; tmux still reads `#` as the start of a format in a
message, so it is doubled, and the message is kept to one short line.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import asdict, dataclass
from typing import Callable, Mapping

from console.profile import NotifySection

COMMAND_TIMEOUT_S = 10.0
TMUX_TIMEOUT_S = 5.0
TMUX_MESSAGE_MAX = 200


@dataclass(frozen=True)
class CallEvent:
    """What a notify command reads on stdin (one JSON object)."""
    event: str  # load_ready | load_failed | stage_completed | stage_failed
    text: str  # the line the console shows
    profile: str
    host: str
    ts: float
    stage: str | None = None
    run_id: str | None = None
    model: str | None = None
    error: str | None = None

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode() + b"\n"


def tmux_message(text: str) -> str:
    one_line = " ".join(text.split())
    if len(one_line) > TMUX_MESSAGE_MAX:
        one_line = one_line[:TMUX_MESSAGE_MAX - 1] + "…"
    return "eagle3-console: " + one_line.replace("#", "##")


class Caller:
    def __init__(self, settings: NotifySection, *, bell: Callable[[], None],
                 env: Mapping[str, str] | None = None):
        self.settings = settings
        self.bell = bell
        self.env = os.environ if env is None else env
        self.problems: list[str] = []  # why a channel failed, for the app to show once

    async def call(self, event: CallEvent) -> list[str]:
        """Ring every channel that is on; returns what went wrong (empty when all worked)."""
        problems: list[str] = []
        if self.settings.bell:
            self.bell()
        if self.settings.tmux and self.env.get("TMUX"):
            problem = await self._run(["tmux", "display-message", "--", tmux_message(event.text)], None,
                                      TMUX_TIMEOUT_S)
            if problem:
                problems.append(f"tmux display-message: {problem}")
        if self.settings.command:
            problem = await self._run(list(self.settings.command), event.to_json(), COMMAND_TIMEOUT_S)
            if problem:
                problems.append(f"notify command {self.settings.command[0]}: {problem}")
        self.problems.extend(problems)
        return problems

    async def _run(self, argv: list[str], stdin: bytes | None, timeout: float) -> str | None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            return f"cannot start: {exc.strerror}"
        try:
            _, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return f"still running after {timeout:g} s: killed"
        if proc.returncode:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
            return f"exit {proc.returncode}" + (f" ({tail[0][:120]})" if tail else "")
        return None
