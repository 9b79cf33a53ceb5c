"""Run states from events and units (pure), including the races between a stage's exit and the probe."""
from backend.contract.events import Event
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


def test_a_run_that_writes_between_the_listing_and_the_read_stays_listed():
    """One probe stats the runs, then reads them: the read can return more than the listing saw."""
    book = RunBook("tmux")
    start, step = line("start", total=3), line("progress", done=1, total=3)
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=len(start), mtime=0)])
    book.apply_events("/w/runs/r1", start)
    read = book.reads_wanted()[0]
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=len(start), mtime=1)])  # stat, then the stage writes
    book.apply_events("/w/runs/r1", step, offset=read.offset)
    book.apply_unit_states("e3-generate-r1 0\n", book.pending_units())
    assert [(r.run_id, r.state, r.done) for r in book.infos()] == [("r1", "running", 1)]
    # the next probe's listing is newer than that read: nothing is read again
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=len(start + step), mtime=2)])
    assert book.reads_wanted()[0].offset == len(start + step)


def test_a_read_of_a_file_replaced_meanwhile_is_dropped():
    book = RunBook("tmux")
    first = line("start", total=3) + line("progress", done=2, total=3)
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=len(first), mtime=0)])
    book.apply_events("/w/runs/r1", first)
    read = book.reads_wanted()[0]
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=5, mtime=1)])  # --fresh archived it
    book.apply_events("/w/runs/r1", line("progress", done=3, total=3), offset=read.offset)  # the old file's bytes
    assert book.reads_wanted()[0].offset == 0 and not book.infos()


def test_running_eta_from_rate():
    book = RunBook("tmux")
    book.apply_listing([RunFile("/w/runs/r1", "r1", size=1, mtime=0)])
    book.apply_events("/w/runs/r1", line("start", total=100) + line("progress", done=40, total=100, rate=4.0))
    book.apply_unit_states("e3-generate-r1 0\n", book.pending_units())
    assert book.infos()[0].eta_s == 15.0
