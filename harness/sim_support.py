"""Start and stop the vLLM stand-in as a real subprocess for the sim tests (loopback only)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
MODEL = "/shared/kimi-k2.5-int4"
# The interpreter with this checkout importable, for commands run over SSH or under systemd, where
# neither the test's cwd nor an editable install can be relied on to find `sim` and `backend`.
PYTHON = ["env", f"PYTHONPATH={REPO}", sys.executable]
# the tiny verifier's aux layers the extraction tests ask for, and what speculators' launcher asks the server
# for: the aux ids, then the tiny verifier's final layer
EXTRACT_AUX = [1, 2, 3]
ASKED = [*EXTRACT_AUX, 4]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def extraction_flags(layers, storage) -> list[str]:
    """vLLM's flags for a hidden-states extraction server (the stand-in takes the same)."""
    spec = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layers}}}
    kv = {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    return ["--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv)]


def first_listen(port: int, stop: threading.Event, out: list[float]) -> None:
    """Append the monotonic time the port first accepts a connection (a 2 ms connect loop: the stand-in,
    like vLLM, binds at once but listens only when loaded); run it on a thread, `stop` ends it early."""
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.05):
                out.append(time.monotonic())
                return
        except OSError:
            time.sleep(0.002)


class SimServer:
    def __init__(self, workdir: Path, *args: str, load_seconds: float = 0.4, shards: int = 4,
                 port: int | None = None, env: dict[str, str] | None = None):
        self.port = port or free_port()
        self.env = {**os.environ, **env} if env else None
        self.workdir = workdir
        self.out_path = workdir / f"stdout-{self.port}.log"
        self.log_path = workdir / f"file-{self.port}.log"
        self.state_path = workdir / f"gpus-{self.port}.json"
        self.argv = [sys.executable, "-m", "sim.vllm_server", "--model", MODEL, "--host", "127.0.0.1",
                     "--port", str(self.port), "--load-seconds", str(load_seconds), "--shards", str(shards),
                     "--gpu-state", str(self.state_path), "--log-file", str(self.log_path), *args]
        self.proc: subprocess.Popen | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> "SimServer":
        self._out = open(self.out_path, "wb")
        self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=self._out, stderr=subprocess.STDOUT,
                                     env=self.env)
        return self

    def output(self) -> str:
        return self.out_path.read_bytes().decode()

    def wait_for(self, marker: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker in self.output():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"stand-in exited {self.proc.returncode} before {marker!r}:\n{self.output()}")
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {marker!r}:\n{self.output()}")

    def wait_ready(self, timeout: float = 15.0) -> "SimServer":
        self.wait_for("Application startup complete.", timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        raise AssertionError("never became healthy")

    def wait_exit(self, timeout: float = 10.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"stand-in did not exit:\n{self.output()}")

    def terminate(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        if getattr(self, "_out", None):
            self._out.close()

    def post(self, path: str, body: dict, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=kw.pop("timeout", 10), **kw)

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, timeout=kw.pop("timeout", 10), **kw)
