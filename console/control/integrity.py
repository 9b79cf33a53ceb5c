"""The host's integrity as `profile check` asks it (`python -m backend.ask integrity`, backend/kit/hostfacts.py):
warnings for two vLLM installs and a driver older than torch's CUDA build needs, a refusal for a leftover
server on the profile's port (a listener in a systemd service other than the profile's unit). The stages
ask the same in their own preflights, and the switch before it stops anything."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from console.control.launch import StageError, ensure_backend
from console.control.stage_argv import nvidia_smi_prefix
from console.host.base import Host, HostError
from console.parsers.text import clean
from console.profile import Profile

INTEGRITY_TIMEOUT_S = 60.0
ANSWER_MAX = 256 * 1024


@dataclass
class Integrity:
    warnings: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    note: str = ""  # why it was not asked (empty: it was)


def integrity_argv(profile: Profile) -> list[str]:
    argv = [profile.paths.python, "-m", "backend.ask", "integrity", "--port", str(profile.server.port)]
    if profile.server.manager == "systemd":
        argv += ["--unit", profile.server.unit]
    smi = nvidia_smi_prefix(profile)
    if smi != ["nvidia-smi"]:
        argv += ["--nvidia-smi", json.dumps(smi)]
    return argv


def parse_integrity(stdout: str) -> Integrity:
    """The answer's failed checks (pure: the host's text, bounded and cleaned): warnings and refusals."""
    try:
        report = json.loads(stdout[:ANSWER_MAX])
    except ValueError:
        return Integrity(note="the host's answer was not JSON")
    checks = report.get("checks") if isinstance(report, dict) else None
    out = Integrity()
    for c in checks if isinstance(checks, list) else []:
        if not isinstance(c, dict) or c.get("ok") is not False:
            continue
        fix = f" -> {c['fix']}" if c.get("fix") else ""
        text = clean(f"{c.get('name')}: {str(c.get('detail'))[:600]}{str(fix)[:600]}")
        (out.warnings if c.get("warning") is True else out.refusals).append(text)
    return out


async def host_integrity(host: Host, profile: Profile) -> Integrity:
    shown: list[str] = []
    try:
        code_dir = await ensure_backend(host, profile, shown)
        res = await host.run(["env", f"PYTHONPATH={code_dir}", *integrity_argv(profile)],
                             timeout=INTEGRITY_TIMEOUT_S)
    except (HostError, StageError, OSError) as exc:
        return Integrity(note=clean(str(exc))[:300] or type(exc).__name__)
    if not res.ok and not res.stdout.strip():  # an older backend without the question, a broken python
        err = (res.stderr or "").strip().splitlines()
        return Integrity(note=clean(err[-1] if err else f"exit {res.returncode}")[:300])
    return parse_integrity(res.stdout)
