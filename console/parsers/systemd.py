"""`systemctl show UNIT -p ...` -> ServiceInfo (plus a note an operator can act on)."""
from __future__ import annotations

from dataclasses import dataclass

from console.snapshot import ServiceInfo

SYSTEMCTL_SHOW_PROPS: list[str] = [
    "ActiveState", "SubState", "Result", "NRestarts", "ExecMainPID", "ActiveEnterTimestamp",
    "MemoryCurrent", "LoadState", "InvocationID",
]
# systemd prints uint64 max for "no value" (e.g. MemoryCurrent without memory accounting)
_UINT64_MAX = 2**64 - 1
_NOT_SET = ("", "[not set]", "n/a")


def systemctl_show_argv(unit: str) -> list[str]:
    return ["systemctl", "show", unit, "-p", ",".join(SYSTEMCTL_SHOW_PROPS), "--no-pager"]


@dataclass(frozen=True)
class UnitStatus:
    service: ServiceInfo
    load_state: str | None = None
    note: str | None = None  # why the state is what it is, when systemd alone does not say


def parse_props(text: str) -> dict[str, str]:
    """KEY=VALUE lines; anything else is ignored. Values keep '=' characters after the first."""
    props: dict[str, str] = {}
    if not isinstance(text, str):
        return props
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and key.strip() == key and " " not in key:
            props[key] = value.strip()
    return props


def _count(value: str | None) -> int | None:
    """A non-negative integer property, or None when unset/unknown/malformed."""
    if value is None or value.strip().lower() in _NOT_SET:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    if number < 0 or number >= _UINT64_MAX:
        return None
    return number


def read_unit_status(text: str, unit: str = "") -> UnitStatus:
    props = parse_props(text)
    load_state = props.get("LoadState") or None
    active = props.get("ActiveState") or "unknown"
    sub = props.get("SubState") or "unknown"
    pid = _count(props.get("ExecMainPID"))
    since = props.get("ActiveEnterTimestamp")
    result = props.get("Result") or None
    note = None
    if load_state == "not-found":
        active, sub = "inactive", "dead"
        note = f"unit {unit or '(unnamed)'} not found on the host: not installed yet, or a typo in the profile"
    elif load_state == "masked":
        note = f"unit {unit or '(unnamed)'} is masked: `systemctl unmask` it before starting"
    elif load_state in ("error", "bad-setting"):
        note = f"unit {unit or '(unnamed)'} failed to load ({load_state}): check its unit file"
    elif not props:
        note = "systemctl show printed no properties"
    service = ServiceInfo(
        manager="systemd",
        unit=unit,
        active_state=active,
        sub_state=sub,
        restarts=_count(props.get("NRestarts")),
        since=None if since is None or since.strip().lower() in _NOT_SET else since,
        main_pid=pid if pid else None,  # 0 means no main process
        memory_bytes=_count(props.get("MemoryCurrent")),
        result=result,
        invocation=props.get("InvocationID") or None,
    )
    return UnitStatus(service=service, load_state=load_state, note=note)


def parse_systemctl_show(text: str, unit: str = "") -> ServiceInfo:
    return read_unit_status(text, unit).service
