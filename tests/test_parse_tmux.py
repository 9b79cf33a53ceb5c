from __future__ import annotations

import pytest

from console.parsers.tmux import (PANE_FORMAT, PaneState, has_session_argv, list_panes_argv,
                                  parse_list_panes, parse_tmux_state, tmux_status)


def test_argv():
    assert has_session_argv("e3-serve") == ["tmux", "has-session", "-t", "=e3-serve"]
    assert list_panes_argv("e3-serve") == ["tmux", "list-panes", "-s", "-t", "=e3-serve:", "-F", PANE_FORMAT]
    assert PANE_FORMAT == "#{pane_pid} #{pane_dead} #{pane_dead_status}"


@pytest.mark.parametrize("text,expected", [
    ("4242 0 \n", [PaneState(4242, False, None)]),
    ("4242 0\n", [PaneState(4242, False, None)]),
    ("4242 1 0\n", [PaneState(4242, True, 0)]),
    ("4242 1 137\n4243 0 \n", [PaneState(4242, True, 137), PaneState(4243, False, None)]),
    ("4242 1 \n", [PaneState(4242, True, None)]),
    ("", []), ("garbage\n", []), ("x 0 \n", []), ("12 2 \n", []), ("0 0 \n", [PaneState(None, False, None)]),
])
def test_parse_list_panes(text, expected):
    assert parse_list_panes(text) == expected


@pytest.mark.parametrize("rc,stderr,panes,active,sub,pid,result,exit_status", [
    (0, "", "4242 0 \n", "active", "running", 4242, None, None),
    (0, "", "4242 1 0\n", "inactive", "exited", None, "success", 0),
    (0, "", "4242 1 1\n", "failed", "failed", None, "exit-code", 1),
    (0, "", "4242 1 \n", "failed", "failed", None, "signal", None),
    (0, "", "", "active", "unknown", None, None, None),
    (1, "can't find session: e3-serve\n", None, "inactive", "dead", None, None, None),
    # tmux 3.3a with a server running and no such session, for an exact `=NAME` target
    (1, "can't find window: e3-serve\n", None, "inactive", "dead", None, None, None),
    (1, "no server running on /tmp/tmux-0/default\n", None, "inactive", "dead", None, None, None),
    (1, "error connecting to /tmp/tmux-0/default (No such file or directory)\n", None, "inactive", "dead",
     None, None, None),
    (1, "", None, "inactive", "dead", None, None, None),
    (127, "bash: tmux: command not found", None, "unknown", "unknown", None, None, None),
    (None, "", None, "unknown", "unknown", None, None, None),
    (1, "protocol version mismatch", None, "unknown", "unknown", None, None, None),
])
def test_tmux_status(rc, stderr, panes, active, sub, pid, result, exit_status):
    status = tmux_status("e3-serve", rc, stderr, panes)
    s = status.service
    assert (s.manager, s.unit) == ("tmux", "e3-serve")
    assert (s.active_state, s.sub_state, s.main_pid, s.result, status.exit_status) == (
        active, sub, pid, result, exit_status)
    assert parse_tmux_state("e3-serve", rc, stderr, panes) == s


def test_notes_say_why():
    assert "not installed" in tmux_status("s", 127).note
    assert "no tmux session s" == tmux_status("s", 1, "can't find session: s").note
    assert "status 3" in tmux_status("s", 0, "", "1 1 3\n").note
