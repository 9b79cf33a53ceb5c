"""Probe cost over SSH: channels opened per refresh and bytes per refresh.

    python benchmarks/bench_probe.py [--refreshes 20] [--load-seconds 4]

Against a real OpenSSH sshd on loopback (harness/rig/sshd.py; needs root and openssh-server). The host
is this machine seen through that sshd: a tmux-manager profile whose vLLM stand-in is started over SSH,
so the probe, the server-log read and the HTTP checks all travel over the one SSH connection.
Counted from SshHost.channels_opened before/after each batch of refreshes, in two states: while the
stand-in loads (its port is bound, not listening) and once it is ready. Expected: 1 channel per refresh
(the probe) plus the forwarded HTTP connection, opened once and kept alive; a systemd host adds one
long-lived journal stream, opened once.
"""
from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.profile import DEFAULT_GPU_QUERY, profile_from_dict  # noqa: E402
from console.telemetry.collector import Collector  # noqa: E402
from console.commands.server_cmd import server_action  # noqa: E402
from console.host.ssh import SshHost  # noqa: E402
from harness.rig import keys  # noqa: E402
from harness.rig.sshd import SshdServer  # noqa: E402


def bench_profile(sshd: SshdServer, work: Path, load_seconds: float):
    port = keys.free_port()
    python = ["env", f"PYTHONPATH={ROOT}", sys.executable]
    state = str(work / "gpus.json")
    return profile_from_dict({
        "host": {"name": sshd.host, "port": sshd.port, "user": sshd.username,
                 "identity_file": str(sshd.identity_file), "known_hosts": str(sshd.known_hosts)},
        "server": {"manager": "tmux", "unit": f"e3-bench-probe-{port}", "model_path": "/models/bench",
                   "served_model_name": "bench", "port": port, "expected_weights_gib": 40.0,
                   "stop_timeout_s": 20.0,
                   "command": [*python, "-m", "sim.vllm_server", "--model", "/models/bench",
                               "--served-model-name", "bench", "--port", str(port), "--gpus", "8",
                               "--gpu-state", state, "--weights-gib", "40", "--load-seconds", str(load_seconds),
                               "--stats-interval", "5"]},
        "paths": {"work_dir": str(work)},
        "gpus": {"command": [*python, "-m", "sim.nvidia_smi", "--state", state, *DEFAULT_GPU_QUERY[1:]]},
    })


class Counting:
    """Wrap the host's run() to tell probe commands apart and keep their stdout sizes."""

    def __init__(self, host: SshHost):
        self.host = host
        self.runs = 0
        self.probe_bytes: list[int] = []
        inner = host.run

        async def run(argv, **kw):
            res = await inner(argv, **kw)
            self.runs += 1
            if list(argv[:2]) == ["sh", "-c"] and "@@E3PROBE-" in argv[2]:
                self.probe_bytes.append(len(res.stdout.encode("utf-8", "surrogateescape")))
            return res

        host.run = run  # type: ignore[method-assign]


async def measure(collector: Collector, host: SshHost, counter: Counting, n: int, label: str,
                  want_phase: tuple[str, ...]) -> None:
    before, runs_before, bytes_before = host.channels_opened, counter.runs, len(counter.probe_bytes)
    phases = set()
    for _ in range(n):
        snap = await collector.refresh()
        phases.add(snap.server.phase)
        await asyncio.sleep(0.05)
    opened = host.channels_opened - before
    runs = counter.runs - runs_before
    sizes = counter.probe_bytes[bytes_before:]
    print(f"{label}: {n} refreshes, phases {sorted(phases)}")
    print(f"  channels opened: {opened} ({opened / n:.2f} per refresh): {runs} commands, "
          f"{opened - runs} forwarded HTTP connections")
    print(f"  probe stdout: mean {sum(sizes) / max(1, len(sizes)):.0f} bytes, max {max(sizes, default=0)} bytes "
          f"per refresh")
    if not phases & set(want_phase):
        print(f"  (note: expected phase {want_phase})")


async def run(a: argparse.Namespace, sshd: SshdServer, work: Path) -> None:
    profile = bench_profile(sshd, work, a.load_seconds)
    host = SshHost(profile.host.name, port=profile.host.port, username=profile.host.user,
                   identity_file=profile.host.identity_file, known_hosts=profile.host.known_hosts)
    counter = Counting(host)
    collector = Collector(profile, host)
    try:
        await collector.connect()
        rc, shown, out = await server_action(profile, "start-server")
        if rc:
            raise SystemExit(f"start failed: {shlex.join(shown)}: {out}")
        await collector.refresh()  # warm-up
        n = max(1, min(a.refreshes, int(a.load_seconds * 0.6 / 0.15)))
        await measure(collector, host, counter, n, "while loading (port bound, not listening)",
                      ("starting", "loading_weights"))
        deadline = time.monotonic() + 60
        while (await collector.refresh()).server.phase != "ready":
            if time.monotonic() > deadline:
                raise SystemExit("the stand-in did not become ready")
            await asyncio.sleep(0.1)
        await measure(collector, host, counter, a.refreshes, "ready (HTTP checks each refresh)", ("ready",))
    finally:
        await collector.close()
        await server_action(profile, "stop-server")
        await host.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refreshes", type=int, default=20)
    ap.add_argument("--load-seconds", type=float, default=4.0)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="e3-bench-probe-"))
    sshd = SshdServer(work / "sshd")
    sshd.prepare()
    sshd.start()
    try:
        asyncio.run(run(a, sshd, work))
    finally:
        sshd.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
