"""Shared fixtures: the real test rigs (an sshd on loopback, a booted systemd host).

Where a rig cannot be built here the tests using it are skipped with the exact missing thing, except
under CI (CI=true), where a missing rig is a failure: CI silently skipping the SSH tests would hide
exactly the bugs they exist to catch.
"""
from __future__ import annotations

import asyncio
import http.server
import inspect
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

# The rig package lives under tests/; make `harness.rig` importable however pytest was started.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

from harness import unit_times  # noqa: E402
from harness.generate_support import StandIn  # noqa: E402
from harness.rig.availability import rig_unavailable  # noqa: E402
from harness.rig.rootfs import RigUnavailable  # noqa: E402
from harness.rig.sshd import SshdServer, clear_stale_pyenv_lock  # noqa: E402

from console import demo  # noqa: E402

# What makes a test slow, for the `slow` marker below (the fast lane, `./scripts/test.sh --fast`, runs
# `-m "not slow"` in a venv without torch): what starts a program, a demo host or a rig (the subprocess
# module, asyncio's subprocess calls, the demo host's start, the harness modules that start the stand-in,
# stage programs and the rigs), and the training stack with the sim modules that load it (the tiny verifier,
# its hidden states): a test that loads torch needs the full install.
_STARTERS = (asyncio.create_subprocess_exec, asyncio.create_subprocess_shell, demo.start)
_STARTER_MODULES = ("subprocess", "harness.sim_support", "harness.drafter_support", "harness.specdec_support",
                    "harness.train_support", "harness.rig", "torch", "speculators", "transformers",
                    "sim.tinylm", "sim.hidden_states", "sim.extraction")
_OWN_CODE = (str(Path(_REPO_ROOT) / "tests"), str(Path(_REPO_ROOT) / "harness"))


def _from_starter_module(name: str | None) -> bool:
    return bool(name) and any(name == m or name.startswith(m + ".") for m in _STARTER_MODULES)


def _starts_programs(code, namespace: dict, seen: set) -> bool:
    """Whether this code, or the tests' and harness's own functions and classes it names, reach a starter.

    Read from the code objects' names (what they call or import), never by running anything; the
    console's own code is not followed: a LocalHost command it runs is a quick shell call, not a program
    the test waits for."""
    if code in seen:
        return False
    seen.add(code)
    for const in code.co_consts:
        if inspect.iscode(const) and _starts_programs(const, namespace, seen):
            return True
    for name in code.co_names:
        if _from_starter_module(name):  # `import subprocess`, `from harness.sim_support import ...` inside
            return True
        value = namespace.get(name)
        if value is None:
            continue
        if inspect.ismodule(value):
            if _from_starter_module(value.__name__):
                return True
            # `demo.start(...)`, `asyncio.create_subprocess_exec(...)`: the module's attribute named here
            if any(getattr(value, attr, None) in _STARTERS for attr in code.co_names if attr != name):
                return True
            continue
        if any(value is s for s in _STARTERS) or _from_starter_module(getattr(value, "__module__", None)):
            return True
        for func in _own_functions(value):
            if _starts_programs(func.__code__, func.__globals__, seen):
                return True
    return False


def _own_functions(value) -> list:
    """The functions of a helper defined in tests/ or harness/ (a class: its methods)."""
    candidates = vars(value).values() if inspect.isclass(value) else [value]
    found = []
    for c in candidates:
        c = getattr(c, "__func__", c)  # a staticmethod's or classmethod's function
        if callable(c):
            c = inspect.unwrap(c)  # a fixture's or a decorator's wrapper: the code that was written
        if inspect.isfunction(c) and c.__code__.co_filename.startswith(_OWN_CODE):
            found.append(c)
    return found


def _is_slow(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(m) for m in ("rig", "packaging", "engine")):
        return True
    seen: set = set()
    funcs = _own_functions(getattr(item, "function", None)) if hasattr(item, "function") else []
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames:
        for fixturedef in (info.name2fixturedefs.get(name, ()) if info else ()):
            funcs.extend(_own_functions(fixturedef.func))
    return any(_starts_programs(f.__code__, f.__globals__, seen) for f in funcs)


# Work units for the test command's workers (scripts/test.sh: pytest-xdist, --dist loadgroup): a test module
# stays on one worker (its module fixtures are built once), and so do all the tests of a session fixture
# that owns something the machine has one of: the booted systemd rig (root namespaces, its own sshd port)
# and the demo host on vLLM's CPU build (gigabytes of memory, one compile cache).
_SHARED_GROUPS = (("engine", ("engine_demo_dir",)), ("systemd-rig", ("systemd_rig",)))


# The modules whose tests load the training stack in the worker itself (the `torch` fixture below) share one
# worker too: the import costs ~11 CPU-s a process, paid once there instead of in each worker that takes one.
_TRAINING_STACK = "training-stack"


def _work_unit(item: pytest.Item, in_worker: set[str]) -> str:
    for group, fixtures in _SHARED_GROUPS:
        if any(f in item.fixturenames for f in fixtures):
            return group
    if item.get_closest_marker("engine"):
        return "engine-own"  # the engine tier's tests that start engines of their own: beside the demo host's
    module = unit_times.module_of(item.nodeid)
    return _TRAINING_STACK if module in in_worker else module


# What a module's test is expected to take when tests/unit_times.json does not list the module (a new one):
# enough to start a slow unit early rather than last
_UNLISTED_SLOW_S, _UNLISTED_FAST_S = 20.0, 0.1


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """`slow`, by rule: a test that starts a program, a demo host or a rig, or loads the training stack
    (itself, through a fixture, or through a helper of tests/ or harness/), or carries the rig, packaging or engine
    marker; the fast lane (`./scripts/test.sh --fast`) runs the rest.

    Each test also gets its work unit (an xdist_group), and the units are ordered longest first: the workers
    take units in this order, so the last ones taken are short and no worker runs alone at the end. A unit's
    time is its tests' share of their modules' seconds in a recorded full run (tests/unit_times.json,
    harness/unit_times.py); without a record, the rule that ranks the engine, then the systemd rig, then
    modules with slow tests, then the rest."""
    recorded = unit_times.load()
    per_module = Counter(unit_times.module_of(item.nodeid) for item in items)
    rank: dict[str, int] = {}
    seconds: Counter[str] = Counter()
    units: dict[str, str] = {}
    in_worker = {unit_times.module_of(item.nodeid) for item in items if "torch" in item.fixturenames}
    for item in items:
        slow = _is_slow(item)
        if slow:
            item.add_marker(pytest.mark.slow)
        unit = units[item.nodeid] = _work_unit(item, in_worker)
        item.add_marker(pytest.mark.xdist_group(unit))
        order = 0 if unit.startswith("engine") else 1 if unit == "systemd-rig" else 2 if slow else 3
        rank[unit] = min(rank.get(unit, order), order)
        module = unit_times.module_of(item.nodeid)
        seconds[unit] += (recorded[module] / per_module[module] if module in recorded else
                          _UNLISTED_SLOW_S if slow else _UNLISTED_FAST_S)
    # stable: a module keeps its own order
    items.sort(key=lambda item: (-seconds[units[item.nodeid]], rank[units[item.nodeid]]) if recorded
               else rank[units[item.nodeid]])


@pytest.fixture(scope="session")
def torch():
    """torch, for the tests that use it (or speculators, or transformers) in the worker itself: imported
    when the first of them runs, not at collection, where a module-level import cost each of the four
    workers ~11 CPU-s (torch, transformers and speculators) whether it ran such a test or not. Slow by rule:
    the fast lane's venv has no torch."""
    import torch

    return torch


def _start_sshd(workdir: Path) -> SshdServer:
    server = SshdServer(workdir)
    try:
        server.prepare()
        server.start()
    except RigUnavailable as exc:
        server.kill_all()
        rig_unavailable(str(exc))
    return server


@pytest.fixture(scope="session")
def _sshd_session(tmp_path_factory):
    server = _start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.kill_all()


@pytest.fixture
def sshd_server(_sshd_session):
    """A real sshd on 127.0.0.1 for the whole session; tests that kill it must start() it again. Before
    each test a pyenv lock that an earlier test's killed login left is cleared (harness/rig/sshd.py)."""
    clear_stale_pyenv_lock()
    return _sshd_session


@pytest.fixture
def fresh_sshd(tmp_path_factory):
    """A private sshd for a test that kills or restarts it, so others never see the outage."""
    server = _start_sshd(tmp_path_factory.mktemp("sshd-fresh"))
    yield server
    server.kill_all()


@pytest.fixture(scope="session")
def systemd_rig(tmp_path_factory):
    """A booted systemd host (sshd, journald, dbus) in private namespaces, reachable over loopback SSH."""
    from harness.rig.systemd_host import SystemdRig

    rig = SystemdRig(tmp_path_factory.mktemp("systemd-rig"))
    try:
        rig.start()
    except RigUnavailable as exc:
        rig.stop()
        rig_unavailable(str(exc))
    yield rig
    rig.stop()


@pytest.fixture(scope="module")
async def rig_ssh(systemd_rig):
    """An SshHost logged into the booted systemd rig (one connection per test module)."""
    from console.host.ssh import SshHost

    host = SshHost(systemd_rig.host, port=systemd_rig.port, username=systemd_rig.username,
                   identity_file=systemd_rig.identity_file, known_hosts=systemd_rig.known_hosts)
    yield host
    await host.close()


@pytest.fixture(scope="session")
def tiny_drafters(tmp_path_factory):
    """The tiny verifier with an untrained and a trained EAGLE-3 drafter (harness/specdec_support.py)."""
    from harness.specdec_support import make_drafters

    return make_drafters(tmp_path_factory)


@pytest.fixture(scope="session")
def engine_demo_dir(tmp_path_factory):
    """The work dir of the session's one demo host with vLLM's CPU build as its baseline (a start costs 45 s
    to 2 min on 2 cores): the conformance tier starts it and only reads it, the engine pipeline
    (harness/real_engine.py, whose `demo-host start` finds it running) drives it afterwards. Stopped at
    the end of the session."""
    from harness import real_engine

    work = tmp_path_factory.mktemp("engine-demo")
    yield work
    real_engine.stop(work)


@pytest.fixture
def utc(monkeypatch):
    """Times rendered in UTC (snapshots hold clock times)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


class _Answering(http.server.BaseHTTPRequestHandler):
    """Says 200 to everything the one server switch asks (/health, /v1/models with one model)."""

    def do_GET(self):
        body = json.dumps({"data": [{"id": "tiny", "max_model_len": 4096}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


@pytest.fixture
def answering():
    """The URL of a loopback server that answers the switch's readiness checks."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def standin(tmp_path):
    """Start vLLM stand-ins for the generate tests (harness/generate_support.py); killed after the test."""
    servers: list[StandIn] = []

    def make(*args: str, port: int | None = None, wait: bool = True) -> StandIn:
        server = StandIn(tmp_path, port).start(*args, wait=wait)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.kill()
