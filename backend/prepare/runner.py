"""The prepare run: a completed generation run -> speculators' prepared datasets, train and held-out.

1. Read the generation run's rows: its exact token rows (`prepare/tokens.jsonl`: the ids the server
   returned, prompt masked) when it has them, else its records rendered by the server's chat template
   (render.py). Every row is judged (rows.check_row) and either kept or counted under one reason.
2. Split the kept rows by sample id (rows.choose_heldout): a held-out slice the drafter never trains on.
3. Hand each side to speculators' own prepare-data (`load_and_preprocess_dataset`: clipping, filtering,
   shuffling, Arrow format, token frequencies of the training side) and save it under the run dir.

Streaming throughout (one row in memory at a time; per kept row only its id and counts), so a 10K-sample
run of 8K-token rows stays small. Outputs are written beside their final names and renamed into place, so
a crash never leaves half a dataset where the next stage looks; starting the same run again redoes it.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

from backend.contract.jsonl import dumps_line, loads
from backend.contract.lookup import InputError, completed_run
from backend.contract.runs import Manifest, RunDir, read_manifest, write_json_atomic
from backend.kit.lifecycle import StageFailed, StageRun
from backend.kit.verifier import VerifierInfo, read_verifier
from backend.prepare import rows as R
from backend.prepare.config import PrepareConfig
from backend.prepare.render import render_row

STAGE = "prepare"
TRAIN_DIR = "train"
HELDOUT_DIR = "heldout"
TOKEN_FREQ = "token_freq.pt"
SPLIT_FILE = "split.json"
DROPPED_FILE = "dropped.jsonl"
WORK_DIR = "rows"  # intermediate row files, removed once the datasets are in place


@dataclass(frozen=True)
class Inputs:
    run_id: str
    run_hash: str
    source: str  # "token_rows" or "records"
    path: str
    expected_rows: int
    verifier: VerifierInfo


def resolve_inputs(c: PrepareConfig) -> Inputs:
    """Everything checked before the run directory is touched; InputError/VerifierError otherwise."""
    gen = completed_run(c.work_dir, c.input_run, "generate")
    info = read_verifier(c.verifier)
    token_rows, records = gen.outputs.get("token_rows"), gen.outputs.get("records")
    if c.source == "token_rows" and not token_rows:
        raise InputError(f"generate run {gen.run_id} has no token rows (its server returned no token ids): "
                         f"use --source records with --render-endpoint")
    if token_rows and c.source != "records":
        source, path = "token_rows", token_rows
        expected = (gen.summary.get("token_rows") or {}).get("rows") or gen.summary.get("done") or 0
    else:
        if not records:
            raise InputError(f"generate run {gen.run_id} names no records file in its summary")
        if not c.render_endpoint:
            raise InputError(f"generate run {gen.run_id} has no exact token ids, so its turns must be "
                             f"tokenized by the server's chat template: pass --render-endpoint URL (the "
                             f"server running the verifier)")
        source, path = "records", records
        expected = gen.summary.get("done") or 0
    if not os.path.isfile(path):
        raise InputError(f"generate run {gen.run_id}: its {source} file {path} is missing")
    manifest = read_manifest(gen.path)  # completed_run has read it once already: it is valid
    return Inputs(run_id=gen.run_id, run_hash=manifest.config_hash if manifest else "", source=source, path=path,
                  expected_rows=int(expected) if isinstance(expected, int) else 0, verifier=info)


def identity_of(c: PrepareConfig, inputs: Inputs) -> dict[str, Any]:
    return {"input_run": inputs.run_id, "input_config_hash": inputs.run_hash, "source": inputs.source,
            "verifier": inputs.verifier.path, "seq_length": c.seq_length, "heldout_fraction": c.heldout_fraction,
            "heldout_min": c.heldout_min, "minimum_valid_tokens": c.minimum_valid_tokens, "seed": c.seed}


def _lines(path: str) -> Iterator[bytes | None]:
    """Each complete line; None for a torn last line (no newline: a crash mid-write)."""
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                yield None
            elif line.strip():
                yield line


def _replace_dir(tmp: str, final: str) -> None:
    old = None
    if os.path.exists(final):
        old = f"{final}.old-{os.getpid()}"
        os.rename(final, old)
    os.rename(tmp, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


class PrepareRunner:
    def __init__(self, config: PrepareConfig):
        self.c = config
        self.ctx: StageRun | None = None
        self.tally = R.Tally()
        self.started = time.monotonic()
        self.last_progress = 0.0
        self.render_error = ""  # the first render failure's text, for the summary
        self.total = 0
        self.verifier_path = ""

    # -- events ----------------------------------------------------------------------------------------
    def emit(self, kind: str, **data: Any) -> None:
        if self.ctx is not None:
            self.ctx.emit(kind, **data)

    @property
    def stop_signal(self) -> str | None:
        return self.ctx.stopping if self.ctx is not None else None

    def progress(self, phase: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_progress < self.c.progress_interval:
            return
        self.last_progress = now
        t = self.tally
        elapsed = now - self.started
        self.emit("progress", phase=phase, done=t.read, total=max(self.total, t.read), failed=0,
                  kept=t.kept, dropped=t.dropped_total, dropped_by_reason=dict(t.dropped), tokens=t.tokens,
                  rate=round(t.read / elapsed, 3) if elapsed > 0 else 0.0)

    def _check_stop(self) -> None:
        if self.ctx is not None:
            self.ctx.check_stop()

    # -- the run ---------------------------------------------------------------------------------------
    def run(self, inputs: Inputs) -> int:
        c = self.c
        manifest = Manifest(stage=STAGE, run_id=c.run_id, identity=identity_of(c, inputs),
                            settings={"render_endpoint": c.render_endpoint,
                                      "render_concurrency": c.render_concurrency})
        ctx = self.ctx = StageRun(STAGE, c.run_id, work_dir=c.work_dir, manifest=manifest, fresh=c.fresh, mode="flag")
        ctx.stop_note = "stopped; start it again to redo it"
        self.total = inputs.expected_rows
        self.verifier_path = inputs.verifier.path
        result: dict[str, Any] = {}

        def body(ctx: StageRun) -> None:
            ctx.start(total=self.total, source=inputs.source)
            result.update(self._run(ctx.run_dir, inputs))

        ctx.summarize = lambda status, error: self._summary(inputs, status, error, result)
        ctx.report = report
        return ctx.run(body)

    def _run(self, run_dir: RunDir, inputs: Inputs) -> dict[str, Any]:
        c = self.c
        work = run_dir.file(WORK_DIR)
        shutil.rmtree(work, ignore_errors=True)  # a previous attempt's leftovers: this run redoes them
        os.makedirs(work)
        candidates = os.path.join(work, "candidates.jsonl")
        meta: dict[str, tuple[int, int, bool]] = {}
        with open(candidates, "wb") as out, open(run_dir.file(DROPPED_FILE), "wb") as dropped:
            rows = self._token_rows(inputs) if inputs.source == "token_rows" else self._rendered_rows(inputs)
            for sample_id, row, reason, detail in rows:
                self.tally.read += 1
                if reason is None:
                    reason = R.check_row(row, vocab_size=inputs.verifier.vocab_size, seq_length=c.seq_length,
                                         minimum_valid_tokens=c.minimum_valid_tokens)
                if reason is None and row["id"] in meta:
                    reason = R.DUPLICATE
                if reason is not None:
                    self.tally.drop(reason)
                    dropped.write(dumps_line({"id": sample_id, "reason": reason, **({"detail": detail} if detail else {})}))
                else:
                    meta[row["id"]] = R.clipped(row, c.seq_length)
                    out.write(dumps_line({"id": row["id"], "input_ids": row["input_ids"],
                                          "loss_mask": row["loss_mask"]}))
                    self.tally.keep(*meta[row["id"]])
                self.progress("reading" if inputs.source == "token_rows" else "rendering")
                self._check_stop()
        self.progress("splitting", force=True)
        count = R.heldout_count(len(meta), c.heldout_fraction, c.heldout_min)
        if len(meta) < 1 or (c.heldout_fraction > 0 and count == 0):
            raise StageFailed(f"only {len(meta)} usable rows of {self.tally.read} "
                              f"({self._dropped_text()}): too few to train on and hold some out; generate "
                              f"more samples, or look at {DROPPED_FILE} in the run directory")
        heldout = R.choose_heldout(meta, count, c.seed)
        sides = {TRAIN_DIR: os.path.join(work, "train.jsonl"), HELDOUT_DIR: os.path.join(work, "heldout.jsonl")}
        with open(sides[TRAIN_DIR], "wb") as train_f, open(sides[HELDOUT_DIR], "wb") as held_f:
            for line in _lines(candidates):
                (held_f if loads(line)["id"] in heldout else train_f).write(line)
        split = {"seed": c.seed, "heldout_fraction": c.heldout_fraction, "heldout_min": c.heldout_min,
                 "heldout_ids": sorted(heldout, key=lambda i: R.rank(i, c.seed))}
        write_json_atomic(run_dir.file(SPLIT_FILE), split)
        counts = {side: self._side_counts(meta, heldout, side == HELDOUT_DIR) for side in sides}
        self._check_stop()
        self.progress("writing", force=True)
        outputs = {"train_data": self._build(run_dir, sides[TRAIN_DIR], TRAIN_DIR, counts[TRAIN_DIR]["rows"],
                                             token_freq=True)}
        if heldout:
            outputs["heldout_data"] = self._build(run_dir, sides[HELDOUT_DIR], HELDOUT_DIR,
                                                  counts[HELDOUT_DIR]["rows"], token_freq=False)
        outputs["token_freq"] = run_dir.file(TOKEN_FREQ)
        outputs["split"] = run_dir.file(SPLIT_FILE)
        shutil.rmtree(work, ignore_errors=True)
        return {"outputs": outputs, "train": counts[TRAIN_DIR], "heldout": counts[HELDOUT_DIR]}

    @staticmethod
    def _side_counts(meta: dict[str, tuple[int, int, bool]], heldout: set[str], held: bool) -> dict[str, int]:
        picked = [v for k, v in meta.items() if (k in heldout) == held]
        return {"rows": len(picked), "tokens": sum(v[0] for v in picked),
                "supervised_tokens": sum(v[1] for v in picked)}

    def _dropped_text(self) -> str:
        return ", ".join(f"{n} {why}" for why, n in sorted(self.tally.dropped.items())) or "none dropped"

    # -- sources ---------------------------------------------------------------------------------------
    def _token_rows(self, inputs: Inputs) -> Iterator[tuple[str, Any, str | None, str]]:
        for line in _lines(inputs.path):
            if line is None:
                yield "", None, R.UNREADABLE, "torn last line"
                continue
            try:
                row = loads(line)
            except ValueError:
                yield "", None, R.UNREADABLE, ""
                continue
            yield (row.get("id") if isinstance(row, dict) and isinstance(row.get("id"), str) else ""), row, None, ""

    def _rendered_rows(self, inputs: Inputs) -> Iterator[tuple[str, Any, str | None, str]]:
        c = self.c
        self._check_render_endpoint()
        window: deque[tuple[str, Future | None, str | None]] = deque()
        failures = 0
        with ThreadPoolExecutor(max_workers=c.render_concurrency, thread_name_prefix="render") as pool:
            def drain(limit: int) -> Iterator[tuple[str, Any, str | None, str]]:
                nonlocal failures
                while len(window) > limit:
                    sample_id, fut, early = window.popleft()
                    if fut is None:
                        yield sample_id, None, early, ""
                        continue
                    row, reason, detail = fut.result()
                    if reason == R.RENDER_FAILED:
                        failures += 1
                        self.render_error = self.render_error or detail
                        if failures >= c.max_render_failures:
                            for _, f, _ in window:
                                if f is not None:
                                    f.cancel()
                            raise StageFailed(f"{failures} renders in a row failed at {c.render_endpoint} "
                                              f"(last: {detail}); is the server up and serving the verifier? "
                                              f"Start the run again to redo it")
                    else:
                        failures = 0
                    yield sample_id, row, reason, detail

            for line in _lines(inputs.path):
                if line is None:
                    window.append(("", None, R.UNREADABLE))
                else:
                    try:
                        record = loads(line)
                    except ValueError:
                        window.append(("", None, R.UNREADABLE))
                    else:
                        sid = record.get("id") if isinstance(record, dict) else None
                        window.append((sid if isinstance(sid, str) else "",
                                       pool.submit(render_row, record, c.render_endpoint, c.seq_length), None))
                yield from drain(2 * c.render_concurrency)
                if self.stop_signal:
                    break
            yield from drain(0)

    def _check_render_endpoint(self) -> None:
        """One tiny render first: a server that is down or has no render endpoint fails the run at once
        with that reason, instead of after every row's retries."""
        import httpx

        url = f"{self.c.render_endpoint.rstrip('/')}/v1/chat/completions/render"
        try:
            resp = httpx.post(url, json={"messages": [{"role": "user", "content": "hi"}],
                                         "add_generation_prompt": True}, timeout=30)
        except httpx.HTTPError as exc:
            raise StageFailed(f"the render endpoint {url} does not answer ({type(exc).__name__}: {exc}); start "
                              f"the server that serves the verifier, then start this run again") from None
        if resp.status_code != 200 or "token_ids" not in (resp.json() if resp.headers.get(
                "content-type", "").startswith("application/json") else {}):
            raise StageFailed(f"{url} answered HTTP {resp.status_code} without token_ids: the server needs "
                              f"vLLM's render endpoint (vLLM >= 0.15); or generate with return_token_ids "
                              f"so prepare can use the exact ids")

    # -- speculators' prepare-data ----------------------------------------------------------------------
    def _build(self, run_dir: RunDir, rows_path: str, name: str, expected: int, *, token_freq: bool) -> str:
        from speculators.data_generation.preprocessing import load_and_preprocess_dataset

        c = self.c
        final = run_dir.file(name)
        tmp = f"{final}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        freq_tmp = run_dir.file(f"{TOKEN_FREQ}.tmp-{os.getpid()}")
        dataset, _ = load_and_preprocess_dataset(
            target_model_path=self.verifier_path, train_data_paths=[rows_path], seq_length=c.seq_length,
            build_dataset_num_proc=1, seed=c.seed, token_freq_path=freq_tmp,
            minimum_valid_tokens=c.minimum_valid_tokens, trust_remote_code=c.trust_remote_code,
            skip_token_freq=not token_freq)
        if len(dataset) != expected:
            raise StageFailed(f"speculators kept {len(dataset)} {name} rows where {expected} were expected: "
                              f"its prepare-data judged rows differently (speculators version?)")
        dataset.save_to_disk(tmp)
        _replace_dir(tmp, final)
        if token_freq:
            os.replace(freq_tmp, run_dir.file(TOKEN_FREQ))
        self._check_stop()
        return final


    # -- the end ---------------------------------------------------------------------------------------
    def _summary(self, inputs: Inputs, status: str, error: str | None, result: dict[str, Any]) -> dict[str, Any]:
        if status == "stopped":
            error = f"received {self.stop_signal or 'a stop signal'}: stopped; start it again to redo it"
        t = self.tally
        summary: dict[str, Any] = {
            "stage": STAGE, "run_id": self.c.run_id, "status": status, "input_run": inputs.run_id,
            "source": inputs.source, "verifier": inputs.verifier.path, "seq_length": self.c.seq_length,
            "done": t.read, "total": max(self.total, t.read), "failed": 0,
            "rows": {"read": t.read, "kept": t.kept, "dropped": t.dropped_total,
                     "dropped_by_reason": dict(sorted(t.dropped.items())),
                     "train": (result.get("train") or {}).get("rows", 0),
                     "heldout": (result.get("heldout") or {}).get("rows", 0), "clipped": t.clipped},
            "tokens": {"total": t.tokens, "supervised": t.supervised,
                       "train": (result.get("train") or {}).get("tokens", 0),
                       "heldout": (result.get("heldout") or {}).get("tokens", 0)},
            "supervised_share": t.supervised_share,
            "elapsed_s": round(time.monotonic() - self.started, 3),
            "outputs": result.get("outputs", {}),
        }
        if self.render_error:
            summary["first_render_error"] = self.render_error
        if error:
            summary["error"] = error
        return summary


def report(summary: dict[str, Any]) -> str:
    """The stage's result for a terminal: what was kept, what was dropped and why."""
    rows, tokens = summary["rows"], summary["tokens"]
    lines = [f"prepare {summary['run_id']}: {summary['status']} ({summary['source']} of generate run "
             f"{summary['input_run']})",
             f"  rows     {rows['read']} read, {rows['kept']} kept ({rows['train']} train, {rows['heldout']} "
             f"held out), {rows['dropped']} dropped, {rows['clipped']} clipped to {summary['seq_length']} tokens"]
    for why, n in rows["dropped_by_reason"].items():
        lines.append(f"    dropped {n}: {why}")
    lines.append(f"  tokens   {tokens['total']} kept, {tokens['supervised']} supervised "
                 f"({100 * summary['supervised_share']:.1f}%)")
    return "\n".join(lines)
