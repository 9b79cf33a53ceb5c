"""The operator's unit as systemd runs it: `systemctl show UNIT -p ...` (and, for an exact command line,
`busctl --json=short get-property ... ExecStart`) -> UnitDefinition. Pure functions.

What systemd 252 prints (tests/samples/systemd/unit_show_*.txt, taken on the booted rig):
- `ExecStart={ path=/bin/x ; argv[]=/bin/x a b ; ignore_errors=no ; start_time=[...] ; ... }`, one line per
  command. argv[] is the arguments joined with single spaces (systemctl-show.c: strv_join(argv, " ")), so an
  argument holding a space (a JSON `--compilation-config '{"level": 3}'`) cannot be told from two: the
  exact list comes from the D-Bus property itself (busctl's JSON), this text is the fallback.
- `Environment=A=1 "B=x y" "C=\\$HOME"`: each assignment through shell_maybe_quote (bare when it needs no
  quoting, else in double quotes with `"`, `\\`, `` ` `` and `$` escaped by a backslash).
- `EnvironmentFiles=/etc/x (ignore_errors=yes)`, one line per file (`-` prefix in the unit file: ignore_errors).
- `User=`, `Group=`, `WorkingDirectory=` (empty: unset; `~`: the user's home; a `!` prefix: missing is ok).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

UNIT_PROPS: tuple[str, ...] = ("Id", "LoadState", "ExecStart", "Environment", "EnvironmentFiles", "User", "Group",
                               "WorkingDirectory")
MAX_TEXT = 1 << 20  # a unit's properties are a few KiB; anything past this is not systemd talking
MAX_JSON_DEPTH = 64  # ExecStart's JSON nests 4 deep; json.loads recurses once per level (RecursionError)


class UnitReadError(ValueError):
    """systemd's answer does not describe a runnable service; the message says what is missing."""


@dataclass(frozen=True)
class ExecCommand:
    path: str
    argv: tuple[str, ...]
    exact: bool  # False: split from systemctl show's space-joined text (arguments with spaces are not kept)

    @property
    def command(self) -> list[str]:
        """What to run: the executable's path, then the arguments (argv[0] may differ from the path with `@`)."""
        return [self.path, *self.argv[1:]]


@dataclass(frozen=True)
class UnitDefinition:
    unit: str
    load_state: str | None
    exec_start: tuple[ExecCommand, ...]
    environment: tuple[tuple[str, str], ...] = ()  # in order; a later assignment of a name wins, as in systemd
    environment_files: tuple[tuple[str, bool], ...] = ()  # (path, missing is ok)
    user: str | None = None
    group: str | None = None
    working_directory: str | None = None

    @property
    def env(self) -> dict[str, str]:
        return dict(self.environment)


def show_argv(unit: str) -> list[str]:
    return ["systemctl", "show", unit, "-p", ",".join(UNIT_PROPS), "--no-pager"]


def bus_label(unit: str) -> str:
    """systemd's object-path label of a unit name (bus_label_escape): every byte but [A-Za-z0-9] (and a
    leading digit) as _xx."""
    out = []
    for i, b in enumerate(unit.encode()):
        c = chr(b)
        if (c.isascii() and c.isalpha()) or (c.isdigit() and i > 0):
            out.append(c)
        else:
            out.append(f"_{b:02x}")
    return "".join(out) or "_"


def exec_start_json_argv(unit: str) -> list[str]:
    """The exact ExecStart (busctl --json, systemd >= 240), read-only, no privileges needed."""
    name = unit if "." in unit else f"{unit}.service"
    return ["busctl", "--json=short", "get-property", "org.freedesktop.systemd1",
            f"/org/freedesktop/systemd1/unit/{bus_label(name)}", "org.freedesktop.systemd1.Service", "ExecStart"]


def split_environment(value: str) -> list[str]:
    """The words of a shell_maybe_quote'd, space-joined list (see the module docstring)."""
    words: list[str] = []
    i, n = 0, len(value)
    while i < n:
        if value[i] == " ":
            i += 1
            continue
        word: list[str] = []
        quoted = False
        while i < n and (quoted or value[i] != " "):
            c = value[i]
            if c == '"':
                quoted = not quoted
            elif c == "\\" and quoted and i + 1 < n:
                i += 1
                word.append(value[i])
            else:
                word.append(c)
            i += 1
        if quoted:
            raise UnitReadError(f"Environment: unterminated quote in {value[:200]!r}")
        words.append("".join(word))
    return words


def _assignments(words: list[str]) -> list[tuple[str, str]]:
    out = []
    for w in words:
        name, eq, val = w.partition("=")
        if not eq or not name:
            raise UnitReadError(f"Environment: {w[:200]!r} is not NAME=VALUE")
        out.append((name, val))
    return out


def parse_exec_show(value: str) -> ExecCommand:
    """One `{ path=... ; argv[]=... ; ignore_errors=... ; ... }` value (ExecStart or ExecStartEx)."""
    body = value.strip()
    if not (body.startswith("{ path=") and body.endswith("}")):
        raise UnitReadError(f"ExecStart: expected '{{ path=... ; argv[]=... }}', got {value[:200]!r}")
    path, sep, rest = body[len("{ path="):].partition(" ; argv[]=")
    if not sep:
        raise UnitReadError(f"ExecStart: no argv[] in {value[:200]!r}")
    # the fields after argv[] are systemd's own; the last of these markers ends the arguments
    ends = [rest.rfind(m) for m in (" ; ignore_errors=", " ; flags=")]
    end = max(ends)
    if end < 0:
        raise UnitReadError(f"ExecStart: no ignore_errors/flags field after argv[] in {value[:200]!r}")
    argv = tuple(rest[:end].split(" "))
    return ExecCommand(path=path, argv=argv, exact=False)


def json_too_deep(text: str, bound: int = MAX_JSON_DEPTH) -> bool:
    """Whether arrays/objects in `text` nest deeper than `bound` (brackets inside strings do not count)."""
    depth = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > bound:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def parse_exec_json(text: str) -> tuple[ExecCommand, ...]:
    """busctl --json=short's answer for ExecStart (a(sasbttttuii)): the exact argv of each command."""
    if isinstance(text, str) and json_too_deep(text[:MAX_TEXT]):
        raise UnitReadError(f"busctl ExecStart: the JSON answer ({len(text)} characters, starting "
                            f"{text[:40]!r}) nests deeper than {MAX_JSON_DEPTH} levels; ExecStart's nests 4")
    try:
        data = json.loads(text[:MAX_TEXT])
        items = data["data"] if isinstance(data, dict) and data.get("type", "").startswith("a(sas") else None
    except (ValueError, KeyError, AttributeError, RecursionError):
        items = None
    if not isinstance(items, list):
        raise UnitReadError(f"busctl ExecStart: expected {{'type': 'a(sasbttttuii)', 'data': [...]}}, got "
                            f"{text[:200]!r}")
    out = []
    for item in items:
        if not (isinstance(item, list) and len(item) >= 2 and isinstance(item[0], str) and isinstance(item[1], list)
                and all(isinstance(a, str) for a in item[1])):
            raise UnitReadError(f"busctl ExecStart: an entry is not (path, argv, ...): {str(item)[:200]!r}")
        out.append(ExecCommand(path=item[0], argv=tuple(item[1]), exact=True))
    return tuple(out)


def parse_unit_show(text: str, unit: str = "") -> UnitDefinition:
    """`systemctl show` output for show_argv's properties. Multi-valued properties come one line each."""
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise UnitReadError("systemctl show: no answer, or one too large to be a unit's properties")
    single: dict[str, str] = {}
    execs: list[ExecCommand] = []
    env: list[tuple[str, str]] = []
    files: list[tuple[str, bool]] = []
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "ExecStart":
            if value.strip():
                execs.append(parse_exec_show(value))
        elif key == "Environment":
            env += _assignments(split_environment(value))
        elif key == "EnvironmentFiles":
            if value.strip():
                path, sep2, flag = value.rpartition(" (ignore_errors=")
                if not sep2 or flag not in ("yes)", "no)"):
                    raise UnitReadError(f"EnvironmentFiles: expected 'PATH (ignore_errors=yes|no)', got {value[:200]!r}")
                files.append((path, flag == "yes)"))
        elif key in UNIT_PROPS:
            single[key] = value
    name = single.get("Id") or unit
    load = single.get("LoadState") or None
    return UnitDefinition(unit=name, load_state=load, exec_start=tuple(execs), environment=tuple(env),
                          environment_files=tuple(files), user=single.get("User") or None,
                          group=single.get("Group") or None,
                          working_directory=single.get("WorkingDirectory") or None)


def server_exec(defn: UnitDefinition) -> ExecCommand:
    """The one command of a server unit (Type=simple/exec/notify runs exactly one ExecStart)."""
    if defn.load_state not in (None, "loaded"):
        raise UnitReadError(f"unit {defn.unit}: LoadState={defn.load_state} (not installed, masked or broken)")
    if len(defn.exec_start) != 1:
        raise UnitReadError(f"unit {defn.unit}: expected exactly one ExecStart, found {len(defn.exec_start)}")
    return defn.exec_start[0]
