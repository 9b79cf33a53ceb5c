"""The server's log as the load tracker hears it: the lines of the unit's CURRENT run only.

Two intakes feed one LoadTracker:
- systemd: journal entries (the catch-up read at connect and the live stream), de-duplicated by cursor
  and scoped to the unit's current invocation: journald tags every line with `_SYSTEMD_INVOCATION_ID`,
  and the probe reads the unit's `InvocationID`. A new invocation resets the tracker at once, before the
  new process prints anything (real vLLM spends 5-15 s in imports first), and late lines of an earlier
  run are ignored, so a restart after a failure never reports the old failure.
- tmux: the log file read by byte offset. Each start moves the previous log aside, so a new file
  (another inode) is a new run; a file cut short (copytruncate) is read again from the start. Offsets are
  counted on bytes (never on decoded text), and a line longer than one read is skipped, not waited for.
"""
from __future__ import annotations

from collections import OrderedDict, deque

from console.parsers.journal import JournalEntry
from console.parsers.vllm_load import LoadTracker
from console.parsers.vllm_log import split_cr

JOURNAL_BACKLOG = 3000  # lines read at connect: enough for a whole load sequence
RECENT = 200  # entries kept for a view that starts following the log now
_OLD_INVOCATIONS = 8


class ServerLog:
    def __init__(self) -> None:
        self.tracker = LoadTracker()
        self.invocation: str | None = None
        self.cursor: str | None = None  # the last journal entry seen, to resume the stream after it
        self._old: OrderedDict[str, None] = OrderedDict()
        self._fed: OrderedDict[str, None] = OrderedDict()
        self.recent: deque[JournalEntry] = deque(maxlen=RECENT)  # every run's lines, for the views
        self.file = LogFileCursor()  # tmux: the log file

    # -- invocations (systemd) -----------------------------------------------------------------------

    def begin_invocation(self, invocation: str | None) -> bool:
        """The service manager names the unit's current run; a new one starts a fresh load."""
        if not invocation or invocation == self.invocation or invocation in self._old:
            # an ended run never comes back (systemd gives each start a new id): a probe that read the
            # unit's state before a restart and answers after the stream saw the new run is older news
            return False
        if self.invocation is not None:
            self._old[self.invocation] = None
            while len(self._old) > _OLD_INVOCATIONS:
                self._old.popitem(last=False)
            self.tracker = LoadTracker()
        self.invocation = invocation
        return True

    def feed_entry(self, entry: JournalEntry) -> bool | None:
        """One journal entry of the server unit: True when the tracker took it, False when it belongs
        to another run of the unit, None when it was seen before."""
        if entry.cursor:
            self.cursor = entry.cursor
            if entry.cursor in self._fed:
                return None  # the catch-up read and the stream can both bring it
            self._fed[entry.cursor] = None
            if len(self._fed) > 2 * JOURNAL_BACKLOG:
                self._fed.popitem(last=False)
        self.recent.append(entry)
        inv = entry.invocation
        if inv and inv != self.invocation:
            if inv in self._old:
                return False  # a late line of an earlier run
            if self.invocation is None and entry.from_manager:
                return False  # systemd's own words about a run we do not know is current
            self.begin_invocation(inv)  # the stream saw the new run before the probe did
        self.tracker.feed(entry.message, entry.ts)
        return True

    def feed_backlog(self, entries: list[JournalEntry], invocation: str | None) -> None:
        """The catch-up read at connect: every entry is kept for the views, only the current
        invocation's reach the tracker."""
        self.begin_invocation(invocation)
        for entry in entries:
            if invocation and entry.invocation and entry.invocation != invocation:
                self._old[entry.invocation] = None  # an earlier run: its late lines are ignored too
                if entry.cursor:
                    self.cursor = entry.cursor
                self.recent.append(entry)
                continue
            self.feed_entry(entry)
        while len(self._old) > _OLD_INVOCATIONS:
            self._old.popitem(last=False)

    # -- log file (tmux) -----------------------------------------------------------------------------

    @property
    def log_offset(self) -> int | None:
        return self.file.offset

    def log_read_from(self) -> int:
        return self.file.offset or 0

    def feed_log(self, inode: str, size: int, data: bytes, now: float, *, limit: int) -> list[str]:
        """Bytes of the log file read from `log_read_from()`; returns the complete lines fed.

        The unfinished last line is fed but not consumed (read again next time): a tqdm bar redraws
        with '\\r' and gets its newline only when it ends."""
        lines, partial = self.file.take(inode, size, data, limit=limit)
        if self.file.restarted:
            self.tracker = LoadTracker()
        for msg in lines:
            self.tracker.feed(msg, now)
        if partial:
            self.tracker.feed(partial, now)
        return lines

    def prime_log(self, inode: str, size: int, data: bytes, start: int, now: float) -> None:
        """The tail of the log read at connect (from `start`, maybe mid-line)."""
        self.file = LogFileCursor(inode=inode, offset=start, skip_to_newline=start > 0)
        self.feed_log(inode, size, data, now, limit=1 << 62)


class LogFileCursor:
    """Where a reader of a growing log file is: its identity (inode) and byte offset.

    A file with another inode is a new file (rotated at a restart); one smaller than the offset was cut
    short (copytruncate); both are read again from the start, and `restarted` says so once. Lines are
    split on bytes and decoded one by one, so an undecodable byte never moves the offset, and a line
    longer than one read is skipped rather than waited for."""

    def __init__(self, inode: str | None = None, offset: int | None = None, skip_to_newline: bool = False):
        self.inode = inode
        self.offset = offset
        self.skip_to_newline = skip_to_newline
        self.restarted = False

    def take(self, inode: str, size: int, data: bytes, *, limit: int) -> tuple[list[str], str]:
        """Consume `data` read from `self.offset`; return (complete lines, unfinished last line)."""
        offset = self.offset or 0
        self.restarted = False
        if inode != self.inode or size < offset:
            # another file (a new run) or the same one cut short: read it again from its start
            self.restarted = self.inode is not None
            self.inode, self.offset, self.skip_to_newline = inode, 0, False
            return [], ""
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) >= limit:
            self.offset = offset + len(data)
            self.skip_to_newline = True
            return [], ""
        self.offset = offset + end
        raw = data[:end].split(b"\n")[:-1]
        if self.skip_to_newline and raw:
            raw, self.skip_to_newline = raw[1:], False
        lines = [split_cr(r.decode("utf-8", errors="replace")) for r in raw]
        partial = "" if self.skip_to_newline else split_cr(data[end:].decode("utf-8", errors="replace"))
        return lines, partial
