"""The host's facts, recorded with every run (provenance), and the host-integrity checks of the preflight.

Facts (`collect`): the vLLM, speculators and torch versions (importlib.metadata: nothing is imported),
torch's CUDA build (read from torch/version.py, not by importing torch), the driver version (nvidia-smi,
when present, bounded), the server's command line (redacted, backend/kit/redact.py) and, for train and verify,
the checkpoint's hash. The hash is cheap on purpose: sha256 over config.json's bytes and each weight
file's name, size and mtime (`config+sizes`), not the weights' bytes (a 1T model's are terabytes), so a
changed checkpoint is seen but two byte-identical copies with other mtimes differ. Two runs' facts side by
side say whether the host changed between them.

Integrity (`check_integrity`): what breaks stages before they start: two vLLM installs (importable from
two places on sys.path, or two `vllm` executables on PATH), a driver older than torch's CUDA build needs
(the driver's max CUDA from nvidia-smi's header), something listening on the server's port that is not
the unit's server. Each is a named preflight check with the fix.
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

from backend.kit.preflight import PreflightReport
from backend.kit.redact import redacted

NVIDIA_SMI = ["nvidia-smi"]  # how this host's GPUs are asked (a stage's --nvidia-smi replaces it)
NVIDIA_SMI_TIMEOUT_S = 10.0
PACKAGES = ("vllm", "speculators", "torch")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
HASH_METHOD = "sha256(config.json + weight files' names, sizes, mtimes)"
CONFIG_MAX = 16 << 20


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


def _smi(*args: str) -> str | None:
    if not NVIDIA_SMI or shutil.which(NVIDIA_SMI[0]) is None:
        return None
    try:
        done = subprocess.run([*NVIDIA_SMI, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout[:1 << 20] if done.returncode == 0 else None


def driver_version() -> str | None:
    out = _smi("--query-gpu=driver_version", "--format=csv,noheader")
    first = (out or "").strip().splitlines()[:1]
    return first[0].strip() if first and re.fullmatch(r"[0-9][0-9.]*", first[0].strip()) else None


def parse_driver_cuda(text: str) -> str | None:
    """nvidia-smi's header: `| NVIDIA-SMI 570.133.20   Driver Version: 570.133.20   CUDA Version: 12.8 |`."""
    m = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", text)
    return m.group(1) if m else None


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


def collect(*, server_command: Sequence[str] | None = None, checkpoint: str | None = None) -> dict[str, Any]:
    """The facts recorded in a run's start event and summary (`host`)."""
    facts: dict[str, Any] = {f"{p}_version": version_of(p) for p in PACKAGES}
    facts["torch_cuda"] = torch_cuda()
    facts["driver_version"] = driver_version()
    facts["python"] = sys.version.split()[0]
    if server_command:
        facts["server_command"] = list(redacted(list(server_command)))
    if checkpoint:
        try:
            facts["checkpoint"] = checkpoint_hash(checkpoint)
        except OSError as exc:
            facts["checkpoint"] = {"path": checkpoint, "error": str(exc)[:200]}
    return facts


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
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def listeners(port: int, proc: str = "/proc") -> list[int]:
    """The pids with a socket listening on TCP `port` (v4 or v6), from /proc/net/tcp* and /proc/PID/fd."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}") as fh:
                rows = fh.read(8 << 20).splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cells = row.split()
            # local_address is HEXIP:HEXPORT, state 0A is LISTEN, inode the 10th column
            if len(cells) > 9 and cells[3] == "0A" and int(cells[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cells[9])
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


def check_integrity(report: PreflightReport, *, port: int | None = None, server_pids: Iterable[int] = (),
                    sys_path: Iterable[str] | None = None, path_env: str | None = None,
                    torch_cuda_build: str | None | bool = True, smi_header: str | None | bool = True) -> None:
    """The host-integrity checks (see the module docstring). `server_pids`: the unit's server processes (a
    listener among them is the server itself); the keyword defaults read this host."""
    packages, exes = vllm_installs(sys_path, path_env)
    two = len(packages) > 1 or len(exes) > 1
    report.add("vllm_installs", not two,
               f"vllm importable from {', '.join(packages) or 'nowhere'}; `vllm` on PATH: {', '.join(exes) or 'none'}",
               "keep one vLLM install: `pip uninstall vllm` in the environment the server does not use (or take "
               "the other from PATH / PYTHONPATH); which one a stage and the server load otherwise depends on "
               "the order of sys.path")
    built = torch_cuda() if torch_cuda_build is True else torch_cuda_build
    header = _smi() if smi_header is True else smi_header
    most = parse_driver_cuda(header) if isinstance(header, str) else None
    if isinstance(built, str) and most:
        ok = _version_tuple(most) >= _version_tuple(built)
        report.add("driver_cuda", ok, f"torch is built for CUDA {built}; the driver supports up to CUDA {most}",
                   f"upgrade the NVIDIA driver to one supporting CUDA {built}, or install a torch (and vLLM) built "
                   f"for CUDA {most} or older")
    if port is not None:
        own = set(server_pids)
        others = [p for p in listeners(port) if p not in own]
        report.add("server_port", not others,
                   f"port {port}: " + ("; ".join(f"pid {p} listens ({_cmdline(p)})" for p in others)
                                       if others else "nothing but the unit's server listens"),
                   f"a leftover server holds port {port}: stop it (kill {' '.join(map(str, others))}) or check "
                   f"what started it; the unit's server cannot bind the port while it runs")
