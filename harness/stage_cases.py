"""Every host program in three scenarios, as the stage contract tests run them (tests/test_stage_contract.py,
tests/test_full_disk.py): a command line on real inputs (the tiny verifier, a prepare run made by the real
stage, the vLLM stand-in, the Hub stand-in), its run directory, and when it is mid-body. The "baseline" of
the swapping programs is a stand-in HTTP server that the plans' commands stop and start; the extraction
server they swap in never answers, so a stop lands while they wait for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Callable

from sim.tinylm import DEFAULT_RECIPE

from harness.drafter_support import REPO, copy_runs, prepared_work, stage_env, tiny_verifier, write_generate_run
from harness.sim_support import free_port

LAYERS = [1, 2, 3]
PROGRAMS = ("generate", "prepare", "extract", "train", "verify", "bench", "fetch_drafter", "chain", "benchpair")
SWAPPING = {"extract", "train", "verify", "benchpair"}

BASELINE = r'''
import os, signal, subprocess, sys, time, urllib.request
action, port, pidfile = sys.argv[1], sys.argv[2], sys.argv[3]
url = f"http://127.0.0.1:{port}/"

def answers():
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False

if action == "alive":
    sys.exit(0 if answers() else 1)
if action == "stop":
    try:
        os.kill(int(open(pidfile).read()), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    for _ in range(200):
        if not answers():
            sys.exit(0)
        time.sleep(0.05)
    sys.exit(1)
if action == "start":
    if answers():
        sys.exit(0)
    proc = subprocess.Popen([sys.executable, "-m", "http.server", port, "--bind", "127.0.0.1"],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=os.path.dirname(pidfile))
    open(pidfile, "w").write(str(proc.pid))
    for _ in range(400):
        if answers():
            sys.exit(0)
        time.sleep(0.05)
    sys.exit(1)
'''


class Baseline:
    """The stand-in baseline server: a loopback HTTP server the plans' commands stop and start."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.port = str(free_port())
        self.script = root / "baseline.py"
        self.script.write_text(BASELINE)
        self.pidfile = root / "baseline.pid"
        # what the switch asks of a server that answers (it serves this directory): /health, /v1/models
        (root / "health").write_text("ok")
        (root / "v1").mkdir(exist_ok=True)
        (root / "v1" / "models").write_text(json.dumps({"data": [{"id": "tiny", "max_model_len": 4096}]}))

    def cmd(self, action: str) -> list[str]:
        return [sys.executable, str(self.script), action, self.port, str(self.pidfile)]

    def start(self) -> None:
        subprocess.run(self.cmd("start"), check=True, timeout=60)

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=2):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        subprocess.run(self.cmd("stop"), timeout=60)


def switch_of(baseline: Baseline, away: list[dict[str, Any]], endpoint: str, **extra: Any) -> dict[str, Any]:
    """The one server switch's plan (backend/kit/switch.py): the stand-in baseline home, `away` to switch to."""
    home = {"name": "baseline", "unit": "baseline", "start": baseline.cmd("start"), "stop": baseline.cmd("stop"),
            "alive": baseline.cmd("alive")}
    return {"version": 1, "home": home, "away": away, "endpoint": endpoint, "ready_timeout_s": 600,
            "command_timeout_s": 60, **extra}


def swap_plan(tmp: Path, baseline: Baseline, *, extractor_dies: bool = False) -> Path:
    """The extraction server never answers (so the stage waits in the swap); `extractor_dies`: its unit is
    gone at once (the swap fails)."""
    dead = f"http://127.0.0.1:{free_port()}"
    flag = tmp / "extractor.up"  # its unit runs while the flag is there; a dying one never makes it
    extractor = {"name": "extractor", "unit": "extractor", "start": ["true"] if extractor_dies else ["touch", str(flag)],
                 "stop": ["rm", "-f", str(flag)], "alive": ["test", "-e", str(flag)]}
    plan = {"version": 2, "switch": switch_of(baseline, [extractor], dead, stop_check_s=5),
            "storage_path": str(tmp / "hs-staging"), "aux_layer_ids": LAYERS,
            # the server is asked for the aux ids plus the verifier's final layer (speculators reads it last)
            "extract_layer_ids": [*LAYERS, DEFAULT_RECIPE.layers]}
    path = tmp / "swap-plan.json"
    path.write_text(json.dumps(plan))
    return path


def events(run: Path) -> list[dict[str, Any]]:
    path = run / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n"):
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


class Case:
    """One program in one scenario: its command line, its run, and when it is mid-body."""

    def __init__(self, argv: list[str], work: Path, run_id: str, *, ready: Callable[[list[dict]], bool] | None = None,
                 baseline: Baseline | None = None, env: dict[str, str] | None = None, cleanup=()):
        self.argv, self.work, self.run_id, self.baseline = argv, work, run_id, baseline
        self.ready = ready or (lambda evs: any(e.get("kind") == "start" for e in evs))
        self.env, self.cleanup = env, list(cleanup)

    @property
    def run(self) -> Path:
        return self.work / "runs" / self.run_id


class Kit:
    """What the cases share, each made on first use: the tiny verifier, a real prepare run, an untrained
    draft checkpoint (the cheap programs need none of them)."""

    def __init__(self, tmp_path_factory):
        self.factory = tmp_path_factory
        self.env = {**stage_env(tmp_path_factory)}
        self._made: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key == "env":
            return self.env
        if key not in self._made:
            if key == "tiny":
                self._made[key] = tiny_verifier(self.factory)
            elif key == "prepared":
                self._made[key] = prepared_work(self.factory, self["tiny"])
            elif key == "checkpoint":
                from harness.specdec_support import dry_run

                root = self.factory.mktemp("contract-draft")
                self._made[key] = dry_run(self["tiny"], root / "draft", self.env, layers=LAYERS)
        return self._made[key]


def py(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def make_case(program: str, scenario: str, tmp: Path, kit: dict[str, Any], request) -> Case:
    work = tmp / "work"
    work.mkdir(exist_ok=True)  # the full-disk test mounts a small volume here first
    env = kit["env"]
    tiny = str(kit["tiny"]) if program in ("prepare", "extract", "train", "verify") else ""
    dead = f"http://127.0.0.1:{free_port()}"
    baseline = None
    if program in SWAPPING:
        baseline = Baseline(tmp / "baseline")
        baseline.start()
        request.addfinalizer(baseline.kill)
    plan = swap_plan(tmp, baseline, extractor_dies=scenario == "fail") if baseline and program != "benchpair" else None

    if program == "generate":
        data = tmp / "d.jsonl"
        data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q {i}"}]}) + "\n"
                                for i in range(200)))
        endpoint = dead
        if scenario == "stop":
            from harness.sim_support import SimServer

            sim = SimServer(tmp, "--served-model-name", "m", "--latency", "0.3").start().wait_ready()
            request.addfinalizer(sim.kill)
            endpoint = sim.url
        dataset = str(tmp / "missing.jsonl") if scenario == "bad" else str(data)
        return Case(py("backend.generate", "--dataset", dataset, "--work-dir", str(work), "--run-id", "g",
                       "--endpoint", endpoint, "--model", "m", "--concurrency", "4", "--progress-interval", "0.2",
                       "--min-free-bytes", "0", "--stop-grace-s", "2", "--max-retries", "0"), work, "g",
                    ready=lambda evs: any(e.get("kind") == "progress" for e in evs), env=env)

    if program == "prepare":
        extra: list[str] = []
        if scenario != "fail":
            copy_runs(kit["prepared"], work, ("gen",))
        else:  # records only: the render endpoint must answer, and none does
            from harness.drafter_support import Tokenizer, sample_record

            tok = Tokenizer(kit["tiny"])
            write_generate_run(work, "gen", [sample_record(tok, i) for i in range(4)], token_rows=False)
            extra = ["--render-endpoint", dead]
        source = "nope" if scenario == "bad" else "gen"
        return Case(py("backend.prepare", "--work-dir", str(work), "--run-id", "p", "--input-run", source,
                       "--verifier", tiny, "--seq-length", "512", *extra), work, "p", env=env)

    waiting = lambda evs: any(e.get("phase") == "waiting_for_extractor" for e in evs)  # noqa: E731
    if program == "extract":
        copy_runs(kit["prepared"], work, ("gen", "prep"))
        return Case(py("backend.extract", "--work-dir", str(work), "--run-id", "x",
                       "--input-run", "nope" if scenario == "bad" else "prep", "--verifier", tiny,
                       "--aux-layer-ids", "1,2,3", "--plan", str(plan)), work, "x", ready=waiting,
                    baseline=baseline, env=env)

    if program == "train":
        copy_runs(kit["prepared"], work, ("gen", "prep"))
        return Case(py("backend.train", "--work-dir", str(work), "--run-id", "t",
                       "--input-run", "nope" if scenario == "bad" else "prep", "--verifier", tiny, "--plan", str(plan),
                       "--served-model", "tiny", "--epochs", "1", "--gpus", "0", "--seq-length", "512",
                       "--optimizer", "adamw"), work, "t", ready=waiting, baseline=baseline, env=env)

    if program == "verify":
        from harness.train_support import completed_run

        copy_runs(kit["prepared"], work, ("gen", "prep"))
        prep = json.loads((work / "runs" / "prep" / "summary.json").read_text())
        completed_run(work, "train", "tr", {"heldout_data": prep["outputs"]["heldout_data"],
                                            "checkpoint": str(kit["checkpoint"])},
                      verifier=tiny, speculative_tokens=3, aux_layer_ids=LAYERS)
        return Case(py("backend.verify", "--work-dir", str(work), "--run-id", "v",
                       "--input-run", "nope" if scenario == "bad" else "tr", "--samples", "2", "--plan", str(plan),
                       "--served-model", "tiny"), work, "v", ready=waiting, baseline=baseline, env=env)

    if program == "bench":
        prompts = tmp / "p.jsonl"
        prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                                   for i in range(8)))
        endpoint = dead
        if scenario == "stop":
            from harness.sim_support import SimServer

            sim = SimServer(tmp, "--served-model-name", "m", "--response-tokens", "40",
                            "--latency-per-token", "0.05").start().wait_ready()
            request.addfinalizer(sim.kill)
            endpoint = sim.url
        extra = ["--baseline-run", "nope"] if scenario == "bad" else []
        return Case(py("backend.bench", "--work-dir", str(work), "--run-id", "b", "--endpoint", endpoint,
                       "--model", "m", "--prompts", str(prompts), "--concurrency", "1", "--num-prompts", "8",
                       "--max-tokens", "40", "--client", "ours", "--ready-timeout", "1", *extra), work, "b",
                    ready=lambda evs: any(e.get("kind") == "progress" for e in evs), env=env)

    if program == "fetch_drafter":
        from harness.fake_hub import FakeHub, HubServer, Repo

        hub = FakeHub(repos={"community/d": Repo(files={"config.json": b'{"speculators_config": {}}',
                                                        "model.safetensors": os.urandom(32 << 20)})})
        hub.slow["model.safetensors"] = 0.25
        server = HubServer(hub).__enter__()
        request.addfinalizer(lambda: server.__exit__(None, None, None))
        endpoint = dead if scenario == "fail" else server.url
        repo = "not a repo" if scenario == "bad" else "community/d"
        fenv = {**env, "HF_HOME": str(tmp / "hf"), "HF_HUB_OFFLINE": "0"}
        fenv.pop("HF_TOKEN", None)
        return Case(py("backend.fetch_drafter", "--work-dir", str(work), "--run-id", "f", "--endpoint", endpoint,
                       "--repo", repo), work, "f",
                    ready=lambda evs: any(e.get("phase") == "download" and e.get("done", 0) > 0 for e in evs), env=fenv)

    if program == "chain":
        argv = [sys.executable, "-c", "import time; time.sleep(120)"] if scenario == "stop" else ["false"]
        plan_file = tmp / "chain-plan.json"
        if scenario != "bad":
            plan_file.write_text(json.dumps({"stages": [{"stage": "generate", "run_id": "c-generate", "argv": argv}]}))
        return Case(py("backend.chain", "--work-dir", str(work), "--run-id", "c", "--plan", str(plan_file)), work, "c",
                    ready=lambda evs: any(e.get("current") == "generate" for e in evs), env=env)

    if program == "benchpair":
        # two K of our drafter, as `run bench --k 2,3` plans them: the baseline's bench completes (a bench run
        # written as backend.bench writes one); the K=2 drafter server never answers (the endpoint is the
        # baseline's), so a stop finds the pair waiting in its swap; a failure: it cannot start. Either way
        # the drafter server is stopped and the baseline serves again
        done = ("from harness.train_support import completed_run; import sys; "
                "completed_run(__import__('pathlib').Path(sys.argv[1]), 'bench', 'bp-baseline', {})")
        flag = tmp / "drafter.up"  # the drafter server's unit runs while its flag is there
        servers = [{"name": f"drafter_k{k}", "unit": "drafter",
                    "start": ["false"] if scenario == "fail" else ["touch", str(flag)],
                    "stop": ["rm", "-f", str(flag)], "alive": ["test", "-e", str(flag)]} for k in (2, 3)]
        contenders = [{"server": f"drafter_k{k}", "run_id": f"bp-k{k}", "argv": ["false"],
                       "title": f"drafter (K={k})", "k": k, "ours": True} for k in (2, 3)]
        pair = {"baseline": {"server": "baseline", "run_id": "bp-baseline",
                             "argv": [sys.executable, "-c", done, str(work)]},
                "contenders": contenders,
                "switch": switch_of(baseline, servers, f"http://127.0.0.1:{baseline.port}", stop_check_s=5)}
        if scenario == "bad":
            del pair["switch"]
        plan_file = tmp / "pair-plan.json"
        plan_file.write_text(json.dumps(pair))
        return Case(py("backend.benchpair", "--work-dir", str(work), "--run-id", "bp", "--plan", str(plan_file)),
                    work, "bp", ready=lambda evs: any(e.get("current") == "swap to the drafter (K=2)" for e in evs),
                    baseline=baseline, env=env)
    raise AssertionError(program)


def start(case: Case) -> subprocess.Popen:
    return subprocess.Popen(case.argv, cwd=REPO, env=case.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish_of(case: Case) -> dict[str, Any]:
    evs = events(case.run)
    assert evs and evs[-1]["kind"] == "finish", [e.get("kind") for e in evs]
    assert evs[0]["kind"] == "start"
    return evs[-1]
