"""THE PACKAGING CHECK: the console as an operator installs it, not as a checkout runs it.

Builds the sdist and, from that sdist, the wheel (`python -m build`), installs the wheel into a fresh
venv in a temp dir (no --system-site-packages: the venv must not see this checkout's editable install,
which would hide a file missing from the wheel), its dependencies coming from the package index as on
a fresh machine, and then, from a directory outside the checkout with no PYTHONPATH: `--version`,
`profile check` of the example profile the sdist ships, `demo-host start`, `wait-ready`,
`run generate --limit 5 --wait`, `demo-host stop`, and no process left behind. The venv has no torch,
so the demo's stand-in serves canned text (its `--text-backend auto`). A second fresh venv with
`pip install -e` of a copy of the tree checks that the development install finds the same package data.

Select it alone with `-m packaging`. The build and the venv are made once per test session.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from console.control.launch import backend_bundle

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.packaging,
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("tmux") is None and os.environ.get("CI") != "true",
                       reason="tmux is not installed (scripts/install-system-deps.sh installs it)"),
]
# What the checkout has and a source distribution must not carry over from it.
NOT_SOURCE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".venv", ".pytest_cache", "build",
                                    "dist", ".cache", ".benchmarks", "snapshot_report.html")


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment minus everything that could lead a process back to the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH", "TMUX")}
    env.update(extra)
    return env


def run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, f"{res.args} exited {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


PROBE = """
import importlib.util, inspect, json, os
import backend, console, sim
from console.demo import TEMPLATE
from console.ui.app import ConsoleApp
css = os.path.join(os.path.dirname(inspect.getfile(ConsoleApp)), ConsoleApp.CSS_PATH)
print(json.dumps({"modules": [m.__file__ for m in (console, backend, sim)], "css": os.path.isfile(css),
                  "template": TEMPLATE.is_file(), "no_torch": importlib.util.find_spec("torch") is None}))
"""


@dataclass
class Dist:
    sdist: Path
    wheel: Path


@dataclass
class Installed:
    venv: Path
    python: Path
    console: Path  # the eagle3-console script pip made
    elsewhere: Path  # a directory outside the checkout to run from


def copy_of_tree(base: Path) -> Path:
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)  # builds write egg-info and build/: keep the checkout clean
    return src


@pytest.fixture(scope="session")
def dist(tmp_path_factory) -> Dist:
    """The sdist, and the wheel built from it (so the sdist is proven complete too), off a copy of the tree."""
    base = tmp_path_factory.mktemp("packaging-build")
    src = copy_of_tree(base)
    out = base / "dist"
    ok(run([sys.executable, "-m", "build", "--outdir", str(out), str(src)], cwd=base, env=clean_env(),
           timeout=600))
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(out.iterdir())
    return Dist(sdists[0], wheels[0])


def fresh_venv(base: Path, *pip_args: str) -> Installed:
    """A new venv under `base` (outside the checkout) with `pip install *pip_args` done in it."""
    assert not base.resolve().is_relative_to(ROOT)
    venv = base / "venv"
    # made by the base interpreter, whatever venv (if any) runs pytest
    base_python = Path(getattr(sys, "_base_executable", sys.executable))
    ok(run([str(base_python), "-m", "venv", str(venv)], cwd=base, env=clean_env(), timeout=120))
    python = venv / "bin" / "python"
    # as scripts/install.sh does: a venv's bundled pip before 24.1 took twice the CPU to pick the same wheels
    ok(run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip>=24.1"], cwd=base, env=clean_env(),
           timeout=300))
    ok(run([str(python), "-m", "pip", "install", "-q", *pip_args], cwd=base, env=clean_env(), timeout=600))
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    return Installed(venv, python, venv / "bin" / "eagle3-console", elsewhere)


@pytest.fixture(scope="session")
def installed(dist, tmp_path_factory) -> Installed:
    return fresh_venv(tmp_path_factory.mktemp("packaging-venv"), str(dist.wheel))


def test_wheel_and_sdist_carry_what_runs(dist):
    wheel = set(zipfile.ZipFile(dist.wheel).namelist())
    for needed in ("console/demo.toml", "console/ui/app.tcss", "console/cli.py", "backend/generate/__main__.py",
                   "sim/vllm_server.py", "sim/nvidia_smi.py"):
        assert needed in wheel, f"the wheel lacks {needed}"
    tops = {n.split("/")[0] for n in wheel if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"console", "backend", "sim"}, tops  # no tests/, no profiles/ in site-packages
    entry = zipfile.ZipFile(dist.wheel).read(next(n for n in wheel if n.endswith(".dist-info/entry_points.txt")))
    assert b"eagle3-console = console.cli:main" in entry
    with tarfile.open(dist.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("pyproject.toml", "README.md", "console/demo.toml", "console/ui/app.tcss",
                   "profiles/kimi-k25-int4.toml"):
        assert needed in names, f"the sdist lacks {needed}"
    assert "profiles/demo.toml" not in names


def _pids_mentioning(*needles: str) -> dict[int, str]:
    """Processes whose command line or environment names any of `needles` (our venv, our demo dir)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            stat = (proc / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie already exited; only its parent's wait is missing
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if any(n in cmd or n in env for n in needles):
            found[int(proc.name)] = cmd
    return found


def test_installed_wheel_runs_the_demo_outside_the_checkout(installed, dist, tmp_path):
    inst = installed
    demo_dir = tmp_path / "demo"
    # XDG_CACHE_HOME: the stand-in's model cache and the default demo dir stay in this test's tmp dir
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))

    def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return run([str(inst.console), *args], cwd=inst.elsewhere, env=env, timeout=timeout)

    # the console imports from the venv, never from the checkout; the app's stylesheet is where Textual
    # looks for it (next to the app's module); the venv has no torch
    where = ok(run([str(inst.python), "-c", PROBE], cwd=inst.elsewhere, env=env))
    found = json.loads(where.stdout)
    assert all(Path(p).resolve().is_relative_to(inst.venv.resolve()) for p in found["modules"]), found
    assert found["css"], "console/ui/app.tcss is not installed next to console/ui/app.py"
    assert found["template"], "console/demo.toml is not installed"
    assert found["no_torch"], "the fresh venv has torch: the check would not cover the canned-text demo"

    assert ok(cli("--version")).stdout.strip() == f"eagle3-console {project_version()}"

    example = tmp_path / "kimi-k25-int4.toml"
    with tarfile.open(dist.sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/profiles/kimi-k25-int4.toml"))
        example.write_bytes(tar.extractfile(member).read())
    assert "ok:" in ok(cli("profile", "check", str(example))).stdout

    try:
        started = ok(cli("demo-host", "start", "--dir", str(demo_dir), "--speed", "20"))
        profile = started.stdout.strip()
        assert profile == str(demo_dir / "profile.toml")
        ok(cli("wait-ready", "--profile", profile, "--timeout", "120", timeout=180))
        status = ok(cli("status", "--profile", profile)).stdout
        assert "SIMULATED" in status and "canned text" in status, status
        server_pid = int(json.loads((demo_dir / "gpus.json").read_text())["pid"])
        assert server_pid in _pids_mentioning(str(inst.venv))  # the scan below would see it

        gen = ok(cli("run", "generate", "--profile", profile, "--limit", "5", "--wait", timeout=300))
        assert "done: 5/5 records, 0 failed" in gen.stdout, gen.stdout
        (run_dir,) = (demo_dir / "runs").iterdir()
        assert len((run_dir / "output.jsonl").read_text().splitlines()) == 5
        # the host got the installed backend package and nothing else, addressed by its content hash
        (code_dir,) = (p for p in (demo_dir / "code").iterdir() if p.is_dir())
        assert sorted(os.listdir(code_dir)) == [".complete", "backend"]
        assert code_dir.name == backend_bundle()[0]  # the same host code as this checkout's

        assert cli("demo-host", "stop", "--dir", str(demo_dir)).returncode == 0
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _pids_mentioning(str(inst.venv), str(demo_dir)):
            time.sleep(0.2)
        left = _pids_mentioning(str(inst.venv), str(demo_dir))
        assert not left, f"processes left behind: {left}"
    finally:
        with contextlib.suppress(Exception):
            cli("demo-host", "stop", "--dir", str(demo_dir), timeout=120)
        for pid in _pids_mentioning(str(inst.venv), str(demo_dir)):  # only what this test started
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_editable_install_still_works(tmp_path_factory):
    """`pip install -e` (development) finds the same package data in the tree it points at."""
    base = tmp_path_factory.mktemp("packaging-editable")
    src = copy_of_tree(base)
    inst = fresh_venv(base, "-e", str(src))
    env = clean_env(XDG_CACHE_HOME=str(base / "cache"))
    version = ok(run([str(inst.console), "--version"], cwd=inst.elsewhere, env=env)).stdout.strip()
    assert version == f"eagle3-console {project_version()}"
    found = json.loads(ok(run([str(inst.python), "-c", PROBE], cwd=inst.elsewhere, env=env)).stdout)
    assert all(Path(p).resolve().is_relative_to(src.resolve()) for p in found["modules"]), found
    assert found["css"] and found["template"], found
