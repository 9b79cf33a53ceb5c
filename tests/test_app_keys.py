"""The binding table and user keymaps: valid files remap, bad ones name the file and the key."""
from __future__ import annotations

import pytest

from console.ui.app import ConsoleApp
from harness.fake_controller import FakeController
from console.ui.keys import (KEYS, KeymapError, default_keymap_path, effective_keys, load_keymap, parse_keymap,
                          spec_for, visible_keys)


def test_every_binding_has_a_unique_id_and_key():
    ids = [s.id for s in KEYS]
    keys = [k for s in KEYS for k in effective_keys(s, {})]
    assert len(ids) == len(set(ids)) and len(keys) == len(set(keys))


def test_readonly_table_drops_mutating_actions():
    assert {s.id for s in visible_keys(True)} == {s.id for s in KEYS} - {"start_stage", "stop_stage", "restart_server",
                                                                        "serve_drafter", "serve_baseline", "bench", "prune"}


@pytest.mark.parametrize("text, expected", [
    ('[keys]\nstop_stage = "X"', {"stop_stage": "X"}),
    ('stop_stage = "X"', {"stop_stage": "X"}),  # top level works too
    ('[keys]\nhelp = "h,?"', {"help": "h,question_mark"}),
    ('[keys]\nquit = ["ctrl+q", "Q"]', {"quit": "ctrl+q,Q"}),
    ("", {}),
])
def test_parse_valid(text, expected):
    assert parse_keymap(text, "k.toml") == expected


@pytest.mark.parametrize("text, fragment", [
    ('[keys]\nstop = "X"', "key 'stop': unknown binding id"),
    ('[keys]\nquit = 3', "key 'quit': expected a key name string"),
    ('[keys]\nquit = ""', "key 'quit': expected a key name string"),
    ('[keys]\nquit = "ctrl+"', "'ctrl+' is not a valid key name"),
    ('[keys]\nquit = "s"', "'s' is already bound to 'start_stage'"),
    ('[keys]\nhelp = "/"', "'slash' is already bound"),
    ("[keys\n", "not valid TOML"),
])
def test_parse_invalid_names_file_and_key(text, fragment):
    with pytest.raises(KeymapError) as info:
        parse_keymap(text, "/home/op/.config/eagle3-console/keys.toml")
    assert str(info.value).startswith("/home/op/.config/eagle3-console/keys.toml: ")
    assert fragment in str(info.value)


def test_default_path_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert default_keymap_path() == tmp_path / "eagle3-console" / "keys.toml"
    assert load_keymap(None) == {}  # absent default file: no keymap, no error
    (tmp_path / "eagle3-console").mkdir()
    (tmp_path / "eagle3-console" / "keys.toml").write_text('[keys]\ndeep_check = "D"\n')
    assert load_keymap(None) == {"deep_check": "D"}


def test_explicit_missing_path_is_an_error(tmp_path):
    with pytest.raises(KeymapError, match="cannot read keymap"):
        load_keymap(tmp_path / "nope.toml")


def test_app_refuses_a_bad_keymap_before_starting(tmp_path):
    bad = tmp_path / "keys.toml"
    bad.write_text('[keys]\nexplode = "e"\n')
    with pytest.raises(KeymapError, match=r"keys.toml: key 'explode'"):
        ConsoleApp(FakeController(), keymap_path=bad)


def test_spec_lookup():
    assert spec_for("stop_stage").mutating and not spec_for("deep_check").mutating
