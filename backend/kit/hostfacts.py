"""The host's facts, recorded with every run (provenance), and the host-integrity checks of the preflight.

Facts (`collect`): the vLLM, speculators and torch versions (importlib.metadata: nothing is imported),
torch's CUDA build (read from torch/version.py, not by importing torch), the driver version (nvidia-smi,
when present, bounded), the server's command line (redacted, backend/kit/redact.py) and, for train and verify,
the checkpoint's hash. The hash is cheap on purpose: sha256 over config.json's bytes and each weight
file's name, size and mtime (`config+sizes`), not the weights' bytes (a 1T model's are terabytes), so a
changed checkpoint is seen but two byte-identical copies with other mtimes differ. Two runs' facts side by
side say whether the host changed between them.

Integrity: what breaks stages before they start. `check_integrity`, warnings in every stage's preflight
(backend/kit/preflight.check_host): two vLLM installs (importable from two places on sys.path, or two
`vllm` executables on PATH), a driver older than torch's CUDA build needs (CUDA_DRIVER_MIN, NVIDIA's
table). `leftover_on_port`, a refusal where a server is about to start (the switch, before it stops
anything): something listening on the server's port that is none of the plan's servers.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Iterable, Sequence
from urllib.parse import urlsplit

from backend.kit.preflight import PreflightReport
from backend.kit.redact import redacted

NVIDIA_SMI = ["nvidia-smi"]  # how this host's GPUs are asked (a stage's --nvidia-smi replaces it)
NVIDIA_SMI_TIMEOUT_S = 10.0
PACKAGES = ("vllm", "speculators", "torch")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
HASH_METHOD = "sha256(config.json + weight files' names, sizes, mtimes)"
CONFIG_MAX = 16 << 20
CMDLINE_MAX = 64 * 1024


def version_of(package: str) -> str | None:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a broken install's metadata must not stop a run: it is unknown
        return None


def torch_cuda() -> str | None:
    """torch's CUDA build (torch.version.cuda) read from its version.py: importing torch takes seconds."""
    try:
        path = md.distribution("torch").locate_file("torch/version.py")
        with open(str(path)) as fh:
            text = fh.read(64 * 1024)
    except (md.PackageNotFoundError, OSError):
        return None
    return parse_torch_cuda(text)


def parse_torch_cuda(text: str) -> str | None:
    """`cuda: Optional[str] = '12.8'` (or `cuda = None` on a CPU build) -> "12.8" / None."""
    m = re.search(r"^cuda\b[^=\n]*=\s*['\"]([0-9.]+)['\"]", text, re.M)
    return m.group(1) if m else None


def _smi(*args: str, prefix: Sequence[str] | None = None) -> str | None:
    smi = list(prefix or NVIDIA_SMI)
    if not smi or shutil.which(smi[0]) is None:
        return None
    try:
        done = subprocess.run([*smi, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout[:1 << 20] if done.returncode == 0 else None


def driver_version(prefix: Sequence[str] | None = None) -> str | None:
    out = _smi("--query-gpu=driver_version", "--format=csv,noheader", prefix=prefix)
    first = (out or "").strip().splitlines()[:1]
    return first[0].strip() if first and re.fullmatch(r"[0-9][0-9.]*", first[0].strip()) else None


def checkpoint_hash(path: str) -> dict[str, Any] | None:
    """The checkpoint's cheap hash (see the module docstring), or None when `path` is not a directory."""
    if not path or not os.path.isdir(path):
        return None
    h = hashlib.sha256()
    try:
        with open(os.path.join(path, "config.json"), "rb") as fh:
            h.update(fh.read(CONFIG_MAX))
    except OSError:
        h.update(b"no config.json")
    files = 0
    for name in sorted(os.listdir(path)):
        if name.endswith(WEIGHT_SUFFIXES):
            st = os.stat(os.path.join(path, name))
            h.update(f"\0{name}\0{st.st_size}\0{int(st.st_mtime)}".encode())
            files += 1
    return {"path": path, "sha256": h.hexdigest(), "method": HASH_METHOD, "weight_files": files}


def collect(*, server_command: Sequence[str] | None = None, checkpoint: str | None = None,
            servers: dict[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """The facts recorded in a run's start event and summary (`host`): `server_command`, the server the run
    worked against; `servers`, by name, where it used several (a bench pair's)."""
    facts: dict[str, Any] = {f"{p}_version": version_of(p) for p in PACKAGES}
    facts["torch_cuda"] = torch_cuda()
    facts["driver_version"] = driver_version()
    facts["python"] = sys.version.split()[0]
    if server_command:
        facts["server_command"] = list(redacted(list(server_command)))
    if servers:
        facts["servers"] = {name: list(redacted(list(argv))) for name, argv in servers.items() if argv}
    if checkpoint:
        try:
            facts["checkpoint"] = checkpoint_hash(checkpoint)
        except OSError as exc:
            facts["checkpoint"] = {"path": checkpoint, "error": str(exc)[:200]}
    return facts


def serving_command(endpoint: str, proc: str = "/proc") -> list[str] | None:
    """The command line of the process listening on `endpoint`'s port, as it really runs (None when none
    listens or this user cannot see which process does: another user's sockets hide their pid)."""
    try:
        port = urlsplit(endpoint).port
    except ValueError:
        return None
    if port is None:
        return None
    for pid in listeners(port, proc):
        try:
            with open(f"{proc}/{pid}/cmdline", "rb") as fh:
                raw = fh.read(CMDLINE_MAX)
        except OSError:
            continue
        argv = [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]
        if argv and argv[0]:
            return argv
    return None


# -- integrity --------------------------------------------------------------------------------------------
def vllm_installs(paths: Iterable[str] | None = None, path_env: str | None = None) -> tuple[list[str], list[str]]:
    """(the sys.path entries holding a `vllm` package, the `vllm` executables on PATH), each by real path."""
    packages: list[str] = []
    for entry in (sys.path if paths is None else paths):
        pkg = os.path.join(entry or ".", "vllm", "__init__.py")
        real = os.path.realpath(os.path.dirname(pkg))
        if os.path.isfile(pkg) and real not in packages:
            packages.append(real)
    exes: list[str] = []
    for entry in (os.environ.get("PATH", "") if path_env is None else path_env).split(os.pathsep):
        exe = os.path.join(entry, "vllm")
        if entry and os.path.isfile(exe) and os.access(exe, os.X_OK) and os.path.realpath(exe) not in exes:
            exes.append(os.path.realpath(exe))
    return packages, exes


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


# The oldest Linux x86_64 driver each CUDA toolkit release needs to run everything it builds: NVIDIA's CUDA
# Toolkit Release Notes, Table 3 "CUDA Toolkit and Corresponding Driver Versions" (the GA releases). Below
# it, CUDA minor version compatibility (the same notes, Table 2) still runs a 12.x build on a driver from
# 525.60.13 (13.x from the R580 branch), without the features newer than the driver (PTX it cannot JIT):
# both are warnings, the second says the build cannot run at all.
CUDA_DRIVER_MIN: dict[str, str] = {
    "11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.3": "545.23.06",
    "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03", "12.8": "570.26", "12.9": "575.51.03",
    "13.0": "580.65.06",
}
MINOR_COMPAT_MIN: dict[str, str] = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}


def driver_needed(cuda: str) -> tuple[str, str] | None:
    """(the toolkit's own driver floor, its major's minor-version-compatibility floor) for a CUDA build
    `MAJOR.MINOR`; a release not in the table takes the nearest older one of its major."""
    major_minor = _version_tuple(cuda)[:2]
    if len(major_minor) < 2:
        return None
    known = sorted((v for v in CUDA_DRIVER_MIN if _version_tuple(v)[0] == major_minor[0]
                    and _version_tuple(v) <= major_minor), key=_version_tuple)
    compat = MINOR_COMPAT_MIN.get(str(major_minor[0]))
    if not known or compat is None:
        return None
    return CUDA_DRIVER_MIN[known[-1]], compat


def check_driver(report: PreflightReport, built: str | None, driver: str | None) -> None:
    """`driver_cuda`, a warning: the driver is older than torch's CUDA build needs."""
    needed = driver_needed(built) if built else None
    if not driver or not built or not needed:
        return
    full, compat = needed
    have = _version_tuple(driver)
    if have >= _version_tuple(full):
        report.warn("driver_cuda", True, f"driver {driver}; torch is built for CUDA {built} (needs >= {full})")
        return
    can = (f"below even the CUDA {built.split('.')[0]}.x minor-version-compatibility floor {compat}: CUDA "
           f"cannot initialize, every GPU stage fails" if have < _version_tuple(compat) else
           f"it runs through CUDA minor version compatibility (>= {compat}) but without what needs the newer "
           f"driver (kernels compiled from PTX at load fail)")
    report.warn("driver_cuda", False, f"driver {driver} is older than {full}, which torch's CUDA {built} build "
                f"needs (NVIDIA's CUDA toolkit/driver table); {can}",
                f"upgrade the NVIDIA driver to {full} or newer, or install a torch (and vLLM) built for the CUDA "
                f"this driver supports")


def _listening_rows(port: int, proc: str = "/proc") -> list[list[str]]:
    """The rows of /proc/net/tcp and tcp6 (v4 and v6) of sockets listening on TCP `port`, split in cells:
    local_address is HEXIP:HEXPORT, state 0A is LISTEN, the inode is the 10th cell."""
    found: list[list[str]] = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}") as fh:
                rows = fh.read(8 << 20).splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cells = row.split()
            if len(cells) > 3 and cells[3] == "0A" and int(cells[1].rsplit(":", 1)[1], 16) == port:
                found.append(cells)
    return found


def listeners(port: int, proc: str = "/proc") -> list[int]:
    """The pids with a socket listening on TCP `port` (v4 or v6), from /proc/net/tcp* and /proc/PID/fd."""
    inodes = {cells[9] for cells in _listening_rows(port, proc) if len(cells) > 9}
    pids: list[int] = []
    if not inodes:
        return pids
    for pid in (p for p in os.listdir(proc) if p.isdigit()):
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"{proc}/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                pids.append(int(pid))
                break
    return pids


def _cmdline(pid: int, proc: str = "/proc") -> str:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as fh:
            return fh.read(4096).replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def check_integrity(report: PreflightReport, *, sys_path: Iterable[str] | None = None,
                    path_env: str | None = None, torch_cuda_build: str | None | bool = True,
                    driver: str | None | bool = True, nvidia_smi: Sequence[str] | None = None) -> None:
    """The host-integrity warnings (see the module docstring); the keyword defaults read this host."""
    packages, exes = vllm_installs(sys_path, path_env)
    two = len(packages) > 1 or len(exes) > 1
    report.warn("vllm_installs", not two,
                f"vllm importable from {', '.join(packages) or 'nowhere'}; `vllm` on PATH: {', '.join(exes) or 'none'}"
                + ("; two installs: which one a stage and the server load depends on the order of the path"
                   if two else ""),
                "keep one vLLM install: `pip uninstall vllm` in the environment the server does not use (or take "
                "the other from PATH / PYTHONPATH)")
    built = torch_cuda() if torch_cuda_build is True else torch_cuda_build
    if driver is True:
        driver = driver_version(nvidia_smi)
    check_driver(report, built if isinstance(built, str) else None, driver if isinstance(driver, str) else None)


def check_host(report: PreflightReport, nvidia_smi: list[str] | None = None) -> None:
    """The host-integrity warnings every stage's preflight carries: two vLLM installs, a driver older than
    torch's CUDA build needs (below; the leftover server on the port is the switch's
    refusal, backend/kit/switch.py, where a server is about to start)."""
    try:
        check_integrity(report, nvidia_smi=nvidia_smi)
    except Exception as exc:  # noqa: BLE001 - a check of the host must never break the preflight it adds to
        report.warn("host_integrity", False, f"could not check the host: {type(exc).__name__}: {exc}"[:300],
                    "nothing to do unless a stage fails; then read the host's vLLM installs and driver by hand")


# -- the server's port -------------------------------------------------------------------------------------
def unit_of(pid: int, proc: str = "/proc") -> str | None:
    """The systemd service a process runs in, from its cgroup (`0::/system.slice/NAME.service`), or None."""
    try:
        with open(f"{proc}/{pid}/cgroup") as fh:
            text = fh.read(64 * 1024)
    except OSError:
        return None
    for line in text.splitlines():
        leaf = line.rsplit("/", 1)[-1]
        if leaf.endswith(".service"):
            return leaf
    return None


def port_listening(port: int, proc: str = "/proc") -> bool:
    """Whether any socket listens on TCP `port` (the tables are readable whoever owns the socket)."""
    return bool(_listening_rows(port, proc))


def leftover_on_port(port: int, *, units: Iterable[str] | None, servers_down: bool | None,
                     proc: str = "/proc") -> str | None:
    """Why the port is held by something that is none of the plan's servers (None: it is not). Two ways to
    know: every plan server is down and still something listens; or a listener's pid is visible and it runs
    in a systemd service that is none of the plan's `units` (a previous model's server left running; None:
    the servers are no systemd units, a service says nothing)."""
    pids = listeners(port, proc)
    foreign: list[tuple[int, str | None]] = []
    if units is not None:
        own = {u if u.endswith(".service") else f"{u}.service" for u in units if u}
        foreign = [(p, unit_of(p, proc)) for p in pids]
        foreign = [(p, u) for p, u in foreign if u is not None and u not in own]
    if foreign:
        return "; ".join(f"pid {p} in {u} listens ({_cmdline(p, proc)})" for p, u in foreign)
    if servers_down and port_listening(port, proc):
        who = "; ".join(f"pid {p} ({_cmdline(p, proc)})" for p in pids) or "a process this user cannot see"
        return f"none of the servers it knows runs, yet {who} listens"
    return None


def leftover_message(port: int, why: str) -> str:
    return (f"a leftover server holds port {port}: {why}. The server was not started and nothing was stopped: "
            f"stop the leftover (`ss -ltnp 'sport = :{port}'` names it; `systemctl stop UNIT` or `kill PID`), "
            f"then start again")
