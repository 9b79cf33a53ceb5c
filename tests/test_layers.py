"""The tree's layers hold: telemetry and control never reach the UI, nothing imports in a cycle, and
the bundle uploaded to a GPU host is host code only, and host programs handle signals in one place."""
from __future__ import annotations

import ast
import io
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("console", "backend", "sim")


def module_imports() -> dict[str, set[str]]:
    """Every project module and the project modules it imports (absolute imports, anywhere in it)."""
    files = {}
    for top in PACKAGES:
        for path in (REPO / top).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            files[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != mod and not mod.startswith(name + "."):
                    graph[mod].add(name)
    return graph


def test_no_import_cycles():
    graph = module_imports()
    cycles = []
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(path[path.index(n):] + [n]))
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_telemetry_and_control_never_import_the_ui():
    graph = module_imports()
    for mod, deps in graph.items():
        if mod.startswith(("console.telemetry", "console.control", "console.parsers", "console.host",
                           "console.session", "backend")):
            assert not {d for d in deps if d.startswith("console.ui")}, mod
    # and not Textual either, even indirectly
    code = ("import sys, console.session, console.telemetry.collector, console.control.launch, "
            "console.commands.server_cmd, console.commands.run_cmd; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_the_headless_commands_import_no_host_program_libraries():
    """Scripts and tests call `eagle3-console status` / `wait-ready` hundreds of times: importing the
    generate stage's HTTP client (aiohttp) or torch with it cost each call 0.2 CPU-s or more for nothing."""
    code = ("import sys, console.cli; heavy = ('aiohttp', 'torch', 'transformers', 'datasets', 'speculators'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_backend_imports_nothing_of_the_operator_side():
    graph = module_imports()
    for mod, deps in graph.items():
        if mod.startswith("backend"):
            assert all(d.startswith("backend") for d in deps), (mod, deps)


# a signal handler belongs to the stage lifecycle (one SIGTERM/SIGINT handling per program) and to the
# torchrun worker (a separate process, no lifecycle in it); everything else asks them
SIGNAL_HANDLERS_ALLOWED = {"backend/kit/lifecycle.py", "backend/train/worker.py"}


def test_only_the_lifecycle_and_the_torchrun_worker_install_signal_handlers():
    found = []
    for path in sorted((REPO / "backend").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            f = node.func
            installs = f.attr == "add_signal_handler" or (
                f.attr in ("signal", "set_wakeup_fd") and isinstance(f.value, ast.Name) and f.value.id == "signal")
            if installs and rel not in SIGNAL_HANDLERS_ALLOWED:
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"signal handlers outside {sorted(SIGNAL_HANDLERS_ALLOWED)}: {found}"


def test_uploaded_bundle_is_host_code_only():
    from console.control.launch import backend_bundle
    version, data = backend_bundle()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
    assert names and all(n.startswith("backend/") for n in names), names
    assert any(n == "backend/generate/__main__.py" for n in names)
    assert not [n for n in names if "/sim/" in n or n.startswith(("sim/", "console/"))]
    assert not [n for n in names if n.endswith("profile.py")]


def _deps(graph: dict[str, set[str]], prefix: str) -> dict[str, set[str]]:
    return {m: d for m, d in graph.items() if m == prefix or m.startswith(prefix + ".")}


def test_the_snapshot_model_is_the_bottom_layer_below_the_parsers():
    graph = module_imports()
    assert graph["console.snapshot"] == set()  # records only: it imports nothing of the project
    for mod, deps in _deps(graph, "console.parsers").items():
        # parsers build snapshot records from text; they never reach up into what uses them
        assert all(d.startswith("console.parsers") or d == "console.snapshot" for d in deps), (mod, deps)


def test_telemetry_does_not_import_control():
    graph = module_imports()
    for mod, deps in _deps(graph, "console.telemetry").items():
        assert not {d for d in deps if d.startswith(("console.control", "console.session", "console.commands"))}, \
            (mod, deps)
    # unit and log names: one module below both, which imports only the profile, the run id rule and the
    # bench stages' run names
    assert graph["console.naming"] <= {"console.profile", "backend.contract.runs", "backend.bench"}


def test_the_ui_and_the_parsers_import_no_host_code():
    graph = module_imports()
    for top in ("console.ui", "console.parsers"):
        for mod, deps in _deps(graph, top).items():
            assert not {d for d in deps if d.startswith("backend")}, (mod, deps)


def _imported_tops(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            tops.add(node.module.split(".")[0])
    return tops


def test_benchmarks_import_nothing_from_tests_and_run_without_pytest():
    """What tests and benchmarks share lives in harness/, which imports neither tests/ nor pytest."""
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        assert not _imported_tops(path) & {"tests", "pytest"}, path.name
    modules = sorted(".".join(p.relative_to(REPO).with_suffix("").parts) for p in (REPO / "harness").rglob("*.py"))
    for path in (REPO / "harness").rglob("*.py"):
        assert "tests" not in _imported_tops(path), path
    # and importing all of it works where pytest is not installed
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('pytest', '_pytest', 'tests'):\n"
            "            raise ImportError(f'{name} is blocked')\n"
            "sys.meta_path.insert(0, Block())\n"
            f"for m in {[m.removesuffix('.__init__') for m in modules]!r}:\n"
            "    __import__(m)\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]



def test_test_modules_import_no_other_test_module():
    """A helper that more than one test module uses lives in harness/ (or, for a fixture, tests/conftest.py):
    a test module imported by another runs its module-level code twice and hides where the helper lives."""
    for path in sorted((REPO / "tests").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            relative = isinstance(node, ast.ImportFrom) and node.level > 0
            assert not relative and not any(n == "tests" or n.startswith("tests.") for n in names), \
                f"{path.name}:{node.lineno} imports from tests/: move the helper to harness/"
    assert not [p for p in (REPO / "tests").iterdir() if p.is_dir() and (p / "__init__.py").exists()], \
        "no package under tests/: what tests share lives in harness/"

# ---- the host side's rooms (backend/): the run contract at the bottom, the kit the programs are built from
# above it, the drafter (what train and verify share) above the kit, the programs on top. No arrow runs back up.
ROOM_BELOW = {"backend.contract": ("backend.contract",),
              "backend.kit": ("backend.contract", "backend.kit"),
              "backend.drafter": ("backend.contract", "backend.kit", "backend.drafter")}
# programs that run other programs' stages (the pipeline, the bench pair): they may read a stage's own modules
COMPOSERS = ("backend.chain", "backend.benchpair")


def _top(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every arrow that runs up or sideways: a room importing above itself (the contract anything of the
    kit, the drafter or a program; the kit the drafter or a program; the drafter a program), and a program
    importing another program (a stage another stage), the composers aside."""
    bad = []
    for mod, deps in sorted(graph.items()):
        if not mod.startswith("backend."):
            continue
        top = _top(mod)
        for dep in sorted(d for d in deps if d.startswith("backend.")):
            if top in ROOM_BELOW:
                if _top(dep) not in ROOM_BELOW[top]:
                    bad.append(f"{mod} -> {dep}")
            elif _top(dep) not in ROOM_BELOW and _top(dep) != top and top not in COMPOSERS:
                bad.append(f"{mod} -> {dep}")
    return bad


def test_every_backend_module_is_in_a_room_or_is_a_program():
    tops = {p.name.removesuffix(".py") for p in (REPO / "backend").iterdir() if p.name != "__pycache__"}
    rooms = {r.split(".")[1] for r in ROOM_BELOW}
    assert rooms <= tops
    for name in sorted(tops - rooms - {"__init__"}):
        # a program: `python -m backend.<name>` runs it
        path = REPO / "backend" / name
        assert (path / "__main__.py").exists() or path.with_suffix(".py").exists(), name


def test_the_rooms_and_the_programs_import_only_below_themselves():
    assert room_violations(module_imports()) == []


def test_the_room_rules_refuse_an_arrow_back_up():
    graph = {
        "backend.verify.runner": {"backend.train.runner"},      # a stage importing another stage
        "backend.kit.swap": {"backend.extract.runner"},         # the kit importing a stage
        "backend.kit.switch": {"backend.drafter.verifier"},     # the kit importing the drafter
        "backend.contract.runs": {"backend.kit.lifecycle"},     # the contract importing the kit
        "backend.drafter.draft": {"backend.verify.report"},     # the drafter importing a stage
        "backend.chain.requirements": {"backend.train.runner"},  # a composer: allowed
        "backend.train.runner": {"backend.drafter.verifier", "backend.kit.swap", "backend.contract.runs",
                                 "backend.train.config"},
    }
    assert room_violations(graph) == [
        "backend.contract.runs -> backend.kit.lifecycle", "backend.drafter.draft -> backend.verify.report",
        "backend.kit.swap -> backend.extract.runner", "backend.kit.switch -> backend.drafter.verifier",
        "backend.verify.runner -> backend.train.runner"]
