"""Shared pieces of the drafter-stage tests: the tiny verifier once per session, and generation runs
written the way backend.generate writes them (manifest, events, records, token rows, summary).

The tiny verifier lives under the session's base temp dir at a fixed path, `<basetemp>/xdg/...`, so every
test module (and every stand-in subprocess, given XDG_CACHE_HOME=<basetemp>/xdg) finds the one build.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from backend.contract.events import EventLog
from backend.contract.runs import Manifest, open_run_dir
from backend.generate.records import Completion, build_record, token_row
from sim import textgen, tinycorpus, tinylm
from harness.rig.availability import rig_unavailable

REPO = Path(__file__).resolve().parent.parent


def xdg_home(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "xdg"


def tiny_verifier(tmp_path_factory) -> Path:
    """The demo's tiny verifier, built once per session. The training stack is part of the test command's
    install: where it is missing the tests say so, and under CI they fail rather than skip."""
    import importlib.util

    missing = [m for m in ("torch", "transformers", "tokenizers", "speculators") if importlib.util.find_spec(m) is None]
    if missing:
        rig_unavailable(f"the training modules {', '.join(missing)} (pip install -e '.[train]')")
    root = xdg_home(tmp_path_factory) / "eagle3-console" / "tiny-verifier"
    _copy_the_installed_build(root)
    return tinylm.ensure_model(root=root)


def _copy_the_installed_build(root: Path) -> None:
    """Put the build in the user cache (the install step's, `python -m sim.tinylm`, which scripts/test.sh runs
    beside pytest's start: waited for through its lock; built here when there is none) into the session's
    cache instead of building it a second time (a minute or more of CPU). The build is deterministic (one
    seed): the install's and a session's model.safetensors are byte-identical, and its directory name holds
    the recipe and the corpus digest. Copied beside, then renamed, as a build is."""
    target = root / tinylm.model_dir().name
    if target.exists():
        return
    installed = tinylm.ensure_model()
    if installed.resolve() == target.resolve():
        return
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{installed.name}.", dir=root))
    try:
        shutil.copytree(installed, tmp, dirs_exist_ok=True)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def stage_env(tmp_path_factory, **extra: str) -> dict[str, str]:
    """The environment a stage or stand-in subprocess runs with: this checkout importable, the session's
    tiny verifier in its cache, nothing fetched from a hub, one thread each (the machine is shared)."""
    return {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(xdg_home(tmp_path_factory)),
            "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


def stage_cmd(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_stage(module: str, *args: str, env: dict[str, str], timeout: float = 300,
              **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(stage_cmd(module, *args), capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout, **kw)


class Tokenizer:
    """The tiny verifier's tokenizer and template, as the stand-in renders prompts (template, then encode
    without special tokens)."""

    def __init__(self, model_dir: Path):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)

    def chat(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> list[int]:
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]


def sample_record(tok: Tokenizer, index: int, *, answer_words: int | None = None) -> dict[str, Any]:
    """One generation record as backend.generate writes it, with the ids the verifier would have returned:
    the prompt rendered with the generation prompt, then `<think>reasoning</think>answer<|im_end|>`."""
    qs = tinycorpus.canned_questions()
    prompt = [{"role": "user", "content": qs[index % len(qs)]}]
    reasoning, answer = textgen.generate(1000 + index, qs[index % len(qs)], thinking=True, quote_topic=False)
    answer_text = answer.text if answer_words is None else " ".join(answer.text.split()[:answer_words])
    prompt_ids = tok.chat(prompt, generation_prompt=True)
    ids = tok.encode(f"{tinylm.THINK}{reasoning.text}{tinylm.END_THINK}{answer_text}{tinylm.EOS}")
    completion = Completion(reasoning=reasoning.text, content=answer_text, finish_reason="stop",
                            prompt_tokens=len(prompt_ids), completion_tokens=len(ids), reasoning_tokens=None,
                            prompt_token_ids=prompt_ids, token_ids=ids)
    return build_record(sample_id=f"s{index:05d}", index=index, model="tiny", prompt=prompt,
                        completion=completion, source={"row": index})


def write_generate_run(work_dir: Path, run_id: str, records: list[dict[str, Any]], *, token_rows: bool = True,
                       status: str | None = "completed", extra_token_lines: list[bytes] = (),
                       extra_record_lines: list[bytes] = ()) -> Path:
    """A generation run directory as backend.generate leaves it. `status` None: started, never finished."""
    manifest = Manifest(stage="generate", run_id=run_id, identity={"dataset": "synthetic", "rows": len(records)})
    run_dir = open_run_dir(str(work_dir), run_id, manifest)
    out = Path(run_dir.file("output.jsonl"))
    out.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + b"".join(extra_record_lines))
    summary: dict[str, Any] = {"stage": "generate", "run_id": run_id, "status": status or "running",
                               "done": len(records), "failed": 0, "output": str(out)}
    if token_rows:
        prep = Path(run_dir.file("prepare"))
        prep.mkdir(exist_ok=True)
        rows = [json.dumps(token_row(r)).encode() + b"\n" for r in records]
        (prep / "tokens.jsonl").write_bytes(b"".join(rows) + b"".join(extra_token_lines))
        summary["token_rows"] = {"path": str(prep / "tokens.jsonl"), "rows": len(records)}
    events = EventLog(run_dir.events_path, "generate", run_id)
    events.emit("start", total=len(records), manifest=manifest.to_dict())
    if status is not None:
        if status != "completed":
            summary["error"] = "3 samples failed after retries"
        run_dir.write_summary(summary)
        events.emit("finish", status=status, summary=summary)
    events.close()
    return Path(run_dir.path)


PREPARED_ROWS = 24


def prepared_work(tmp_path_factory, tiny: Path) -> Path:
    """A work dir holding a completed generation run `gen` (24 samples with exact token ids) and its
    prepare run `prep` (20 train, 4 held-out rows, seq length 512); tests add their own runs beside them,
    never change these two. Built once per test run, whatever the number of workers (harness/run_shared.py:
    the prepare stage's start is ~12 CPU-s, and three modules on three workers asked for it), then copied
    into each worker's session, naming that worker's copy of the verifier as its own build would."""
    from harness.run_shared import FixedTemp, held, run_root

    work = tmp_path_factory.getbasetemp() / "prepared-work"
    if (work / "runs" / "prep" / "summary.json").exists():
        return work
    shutil.rmtree(work, ignore_errors=True)
    at = FixedTemp(run_root(tmp_path_factory) / "prepared")
    built = at.root / "work"
    with held(at.root.with_suffix(".lock")):
        verifier_record = at.root / "verifier"
        if not (built / "runs" / "prep" / "summary.json").exists():
            shutil.rmtree(built, ignore_errors=True)
            built.mkdir(parents=True)
            tok = Tokenizer(tiny)
            write_generate_run(built, "gen", [sample_record(tok, i) for i in range(PREPARED_ROWS)])
            res = run_stage("backend.prepare", "--work-dir", str(built), "--run-id", "prep", "--input-run", "gen",
                            "--verifier", str(tiny), "--seq-length", "512", env=stage_env(tmp_path_factory))
            assert res.returncode == 0, res.stderr
            verifier_record.write_text(str(tiny))
        copy_runs(built, work, replace={verifier_record.read_text(): str(tiny)})
    return work


def copy_runs(src: Path, dst: Path, runs: tuple[str, ...] = ("gen", "prep"), *,
              replace: dict[str, str] | None = None) -> None:
    """Runs of one work dir in another (the paths their summaries, manifests and events name, rewritten to
    the new place; `replace`: more paths to rewrite, as {old: new})."""
    swaps = {str(src) + "/": str(dst) + "/", **(replace or {})}
    for run in runs:
        shutil.copytree(src / "runs" / run, dst / "runs" / run)
        for name in ("summary.json", "manifest.json", "events.jsonl"):
            path = dst / "runs" / run / name
            if path.is_file():
                text = path.read_text()
                for old, new in swaps.items():
                    text = text.replace(old, new)
                path.write_text(text)


