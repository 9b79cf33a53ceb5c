"""Disk: free space of the work dir's volume and of the volumes runs live on, each run's size with its
stage, state and age, archived runs (`--fresh` moved them aside; they still hold their space) marked.
Hidden until the operator asks (`u`): sizing a work dir of hidden states reads every file's size, so it
runs on demand, not every tick. `p` prunes (console/control/disk.py: lists, totals and asks first)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content

from console.ui.panes.gauges import human_bytes
from console.control.disk import DiskReport
from console.telemetry.snapshot import Snapshot
from console.ui.panes.base import Pane, Text, age_text, app_clock, lines, markup

SHOWN = 12  # the biggest runs; the rest are counted


def disk_markup(report: DiskReport, now: float) -> Content:
    parts: list[Content | str] = []
    for v in report.volumes:
        frac = 1 - v.free / v.total if v.total else 0.0
        colour = "red" if frac > 0.9 else "yellow" if frac > 0.75 else "green"
        parts.append(markup(f"volume   $path  [{colour}]$free free[/] of $total", path=v.path,
                            free=human_bytes(v.free), total=human_bytes(v.total)))
    runs = sorted(report.runs, key=lambda r: -r.size)
    total = sum(r.size for r in runs)
    archived = [r for r in runs if r.archived]
    summary = f"runs     {len(runs)}, {human_bytes(total)}"
    if archived:
        summary += f"; {len(archived)} archived by --fresh hold {human_bytes(sum(r.size for r in archived))}"
    parts.append(summary)
    for r in runs[:SHOWN]:
        tag = " [yellow](archived)[/]" if r.archived else ""
        parts.append(markup(f"  $size  $stage $state $age  $name{tag}", size=f"{human_bytes(r.size):>10}",
                            stage=f"{r.stage or '?':<10}", state=f"{r.state:<10}",
                            age=f"{age_text(now - r.mtime):>4}", name=r.name))
    if len(runs) > SHOWN:
        parts.append(f"[dim]  … {len(runs) - SHOWN} smaller runs[/]")
    for s in report.skipped:
        parts.append(markup("[yellow]  left out: $s[/]", s=s))
    parts.append("[dim]u refresh   p prune (lists every run it would delete and asks first; never a running or "
                 "resumable run, a stage's newest completed run, the drafter served, nor what they need)[/]")
    return lines(*parts)


class DiskPane(Pane):
    TITLE = "Disk"
    DEFAULT_CSS = """
    DiskPane { display: none; }
    DiskPane.-shown { display: block; }
    """

    report: DiskReport | None = None  # the survey shown, as the host sent it

    def compose_body(self) -> ComposeResult:
        yield Text("", id="disk-body")

    def render_snapshot(self, snapshot: Snapshot) -> None:
        pass  # the survey comes on demand (show_report), not with each snapshot

    def show_report(self, report: DiskReport) -> None:
        self.report = report
        self.guarded(lambda: self.query_one("#disk-body", Text).show(disk_markup(report, app_clock(self))))
        self.set_class(True, "-shown")

    def show_problem(self, text: str) -> None:
        self.query_one("#disk-body", Text).show(markup("[red]$text[/]", text=text))
        self.set_class(True, "-shown")
