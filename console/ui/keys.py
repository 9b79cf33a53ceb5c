"""The one binding table: the footer, the `?` help screen and the user keymap all read it.

Every binding has a stable id so a user can remap it in TOML without knowing action names:

    # $XDG_CONFIG_HOME/eagle3-console/keys.toml
    [keys]
    stop_stage = "X"
    quit = "q,ctrl+q"       # several keys: comma-separated
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from textual.binding import Binding, BindingType
from textual.keys import _character_to_key, format_key


class KeymapError(ValueError):
    """A user keymap that cannot be used; the message names the file and the offending key."""


@dataclass(frozen=True)
class KeySpec:
    id: str
    default: str
    action: str
    description: str
    mutating: bool = False  # removed entirely in --readonly
    show: bool = True  # shown in the footer (all are listed by `?`)


KEYS: tuple[KeySpec, ...] = (
    KeySpec("start_stage", "s", "start_stage", "Start stage", mutating=True),
    KeySpec("stop_stage", "x", "stop_stage", "Stop stage", mutating=True),
    KeySpec("restart_server", "r", "restart_server", "Restart server", mutating=True),
    KeySpec("serve_drafter", "v", "serve_drafter", "Drafter", mutating=True),
    KeySpec("serve_baseline", "b", "serve_baseline", "Baseline", mutating=True),
    KeySpec("bench", "m", "bench", "Bench", mutating=True),
    KeySpec("deep_check", "d", "deep_check", "Deep check"),
    # not in the footer (a 150-column footer is full): `?` lists them, the Disk pane says them
    KeySpec("disk", "u", "disk", "Disk", show=False),
    KeySpec("prune", "p", "prune", "Prune runs", mutating=True, show=False),
    KeySpec("show_log", "l", "show_log", "Stage log"),
    KeySpec("filter", "slash", "filter", "Filter"),
    KeySpec("follow", "f", "toggle_follow", "Follow/pause"),
    KeySpec("help", "question_mark", "help", "Help"),
    KeySpec("quit", "q", "quit", "Quit"),
)
KEY_IDS = frozenset(spec.id for spec in KEYS)
MUTATING_ACTIONS = frozenset(spec.action for spec in KEYS if spec.mutating)

# A key name as Textual spells it: optional modifiers, then a name or one printable character.
_KEY_RE = re.compile(r"((ctrl|shift|alt|meta|super|hyper)\+)*([A-Za-z0-9_]+|[!-~])")


def spec_for(binding_id: str) -> KeySpec:
    for spec in KEYS:
        if spec.id == binding_id:
            return spec
    raise KeyError(binding_id)


def visible_keys(readonly: bool) -> tuple[KeySpec, ...]:
    return tuple(spec for spec in KEYS if not (readonly and spec.mutating))


def app_bindings() -> list[BindingType]:
    """Bindings for the App; readonly hiding is done by ConsoleApp.check_action, not here."""
    return [Binding(spec.default, spec.action, spec.description, show=spec.show, id=spec.id)
            for spec in KEYS]


def default_keymap_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "eagle3-console" / "keys.toml"


def parse_keymap(text: str, source: str = "<keymap>") -> dict[str, str]:
    """Validate keymap TOML; keys may sit at top level or under [keys]. Returns id -> keys."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KeymapError(f"{source}: not valid TOML: {exc}") from None
    table = data.get("keys", data) if isinstance(data.get("keys"), dict) else data
    keymap: dict[str, str] = {}
    for binding_id, value in table.items():
        if binding_id not in KEY_IDS:
            known = ", ".join(sorted(KEY_IDS))
            raise KeymapError(f"{source}: key {binding_id!r}: unknown binding id (known: {known})")
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        if not isinstance(value, str) or not value.strip():
            raise KeymapError(f"{source}: key {binding_id!r}: expected a key name string, got {value!r}")
        keys = [k.strip() for k in value.split(",")]
        for key in keys:
            if not _KEY_RE.fullmatch(key):
                raise KeymapError(f"{source}: key {binding_id!r}: {key!r} is not a valid key name")
        # Textual's own spelling ("?" -> "question_mark"), so clashes are found whatever the user wrote.
        keys = [_character_to_key(k) if len(k) == 1 else k for k in keys]
        keymap[binding_id] = ",".join(keys)
    _check_clashes(keymap, source)
    return keymap


def _check_clashes(keymap: dict[str, str], source: str) -> None:
    # Two actions on one key would make one of them unreachable without any warning.
    owner: dict[str, str] = {}
    for spec in KEYS:
        for key in effective_keys(spec, keymap):
            if key in owner:
                raise KeymapError(f"{source}: key {spec.id!r}: {key!r} is already bound to {owner[key]!r}")
            owner[key] = spec.id


def effective_keys(spec: KeySpec, keymap: dict[str, str]) -> list[str]:
    return [k for k in keymap.get(spec.id, spec.default).split(",") if k]


def load_keymap(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """Load the keymap at `path` (must exist), or the default path if it exists, else {}."""
    if path is None:
        default = default_keymap_path()
        if not default.is_file():
            return {}
        path = default
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise KeymapError(f"{p}: cannot read keymap: {exc.strerror or exc}") from None
    return parse_keymap(text, str(p))


def display_key(key: str) -> str:
    return format_key(key)
