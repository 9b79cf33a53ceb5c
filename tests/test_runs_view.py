"""Run states from events and units (pure), including the races between a stage's exit and the probe."""
from backend.events import Event
from console.telemetry.probe import RunFile
from console.telemetry.runs import RunBook


def line(kind, **data) -> bytes:
    return Event(kind=kind, stage="generate", run_id="r1", ts=1.0, data=data).to_line()


def test_finish_written_just_before_exit_is_not_stale():
    book = RunBook("tmux")
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=len(line("start", total=3)), mtime=0)])
    book.apply_events("/w/runs/r1", line("start", total=3))
    book.apply_unit_states("e3-generate-r1 0\n", book.pending_units())
    assert book.infos()[0].state == "running"
    # an unfinished run is read every probe, whatever the listing said, after its unit was asked
    assert [r.run_dir for r in book.reads_wanted()] == ["/w/runs/r1"]
    book.apply_unit_states("e3-generate-r1 1\n", book.pending_units())  # exited
    book.apply_events("/w/runs/r1", line("finish", status="completed", summary={"done": 3, "total": 3}))
    info = book.infos()[0]
    assert (info.state, info.done, info.total) == ("done", 3, 3)


def test_dead_unit_without_finish_is_stale():
    book = RunBook("systemd")
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=10, mtime=0)])
    book.apply_events("/w/runs/r1", line("start", total=3) + line("progress", done=1, total=3))
    book.apply_unit_states("Id=e3-generate-r1.service\nActiveState=inactive\n", book.pending_units())
    assert book.infos()[0].state == "stale" and book.infos()[0].done == 1


def test_replaced_run_dir_is_read_from_the_start():
    book = RunBook("tmux")
    first = line("start", total=3) + line("finish", status="failed", summary={})
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=len(first), mtime=0)])
    book.apply_events("/w/runs/r1", first)
    assert book.infos()[0].state == "failed"
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=5, mtime=1)])  # --fresh: a new, shorter file
    assert book.reads_wanted()[0].offset == 0


def test_running_eta_from_rate():
    book = RunBook("tmux")
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=1, mtime=0)])
    book.apply_events("/w/runs/r1", line("start", total=100) + line("progress", done=40, total=100, rate=4.0))
    book.apply_unit_states("e3-generate-r1 0\n", book.pending_units())
    assert book.infos()[0].eta_s == 15.0
