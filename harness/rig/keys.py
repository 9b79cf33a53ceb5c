"""Key material for the rigs: ed25519 keys made with ssh-keygen, known_hosts lines, free loopback ports."""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path


def generate_key(path: Path, comment: str = "eagle3-console-test") -> Path:
    """Create an unencrypted ed25519 key pair at `path` / `path`.pub (if not there yet); return `path`."""
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                       check=True, capture_output=True, timeout=30)
    return path


def public_key_text(private_key: Path) -> str:
    """`type base64` of a key pair's public half, without the comment."""
    fields = Path(f"{private_key}.pub").read_text().split()
    return f"{fields[0]} {fields[1]}"


def known_hosts_line(host: str, port: int, host_key: Path) -> str:
    pattern = host if port == 22 else f"[{host}]:{port}"
    return f"{pattern} {public_key_text(host_key)}\n"


def free_port(host: str = "127.0.0.1") -> int:
    # Bound then released: a small race with other processes, acceptable for a test rig.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
