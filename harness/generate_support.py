"""The generate stage's test kit: one vLLM stand-in (sim/vllm_server.py) on a loopback port, a ShareGPT
dataset, the stage's command line with quick intervals, and its run's records and events. The `standin`
fixture (tests/conftest.py) starts these servers and kills them after the test."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from harness.sim_support import free_port

REPO = Path(__file__).resolve().parent.parent
MODEL = "kimi-sim"


class StandIn:
    """One stand-in server process on a loopback port."""

    def __init__(self, tmp: Path, port: int | None = None):
        self.port = port or free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *args: str, wait: bool = True) -> "StandIn":
        argv = [sys.executable, "-m", "sim.vllm_server", "--host", "127.0.0.1", "--port", str(self.port),
                "--model", "/models/kimi", "--served-model-name", MODEL, "--load-seconds", "0.2",
                "--response-tokens", "120", *args]
        log = open(self.tmp / f"sim-{self.port}-{time.monotonic_ns()}.log", "wb")
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, "the stand-in exited while starting"
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("the stand-in did not become ready")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def write_dataset(path: Path, n: int, bad: bool = True) -> int:
    """n good ShareGPT rows (+ malformed ones); returns the number of good rows."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"conversations": [{"from": "human", "value": f"Question {i}: explain topic {i}."},
                                                  {"from": "gpt", "value": "the dataset's own answer"}],
                                "source": "test"}) + "\n")
        if bad:
            f.write("{not json\n")
            f.write(json.dumps({"conversations": []}) + "\n")
            f.write(json.dumps({"messages": [{"role": "assistant", "content": "no question"}]}) + "\n")
            f.write(json.dumps({"conversations": [{"from": "human", "value": 3}]}) + "\n")
    return n


def gen_argv(server: StandIn, dataset: Path, work: Path, *extra: str, run_id: str = "r") -> list[str]:
    return [sys.executable, "-m", "backend.generate", "--dataset", str(dataset), "--work-dir", str(work),
            "--run-id", run_id, "--endpoint", server.url, "--model", MODEL, "--concurrency", "8",
            "--progress-interval", "0.2", "--health-interval", "0.1", "--backoff-base", "0.05",
            "--backoff-max", "0.2", "--flush-every", "4", "--min-free-bytes", "0", *extra]


def run_gen(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def records(run: Path) -> list[dict]:
    lines = (run / "output.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"", "output ends with a torn line"
    return [json.loads(line) for line in lines[:-1]]


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
