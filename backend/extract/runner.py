"""The extract run: every prepared row's hidden states, `hs_{i}.safetensors` aligned with the dataset rows.

    preflight (nothing touched yet)  the prepare run is complete, the verifier is here and has the aux
                                     layers, speculators is installed, the swap plan is sound, and the
                                     hidden states fit on disk (else: ways out that fit the host,
                                     backend/extract/disk.py), the baseline's vLLM is new enough
    swap in (with a plan)            stop the baseline server, start the extraction server, wait until it
                                     answers /health and /v1/models
    extract                          speculators' generate-offline-data for the train and held-out rows
                                     (offline.py, one child process), watched: files counted for progress,
                                     the server's health and unit checked so a server that dies midway
                                     ends the run at once with the reason, and the first file of each
                                     side checked for one state per layer id asked for (the aux ids and
                                     the final layer: backend/kit/verifier.extraction_layer_ids)
    swap back (always)               stop the extraction server and start the baseline again, also after a
                                     failure or SIGTERM; every command and its outcome goes to events.jsonl

Starting the same run again resumes: files already written are kept (generate-offline-data skips them).
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from backend.contract.lookup import CompletedRun, InputError, completed_run
from backend.contract.runs import Manifest, RunDir, read_manifest, run_path
from backend.extract import disk
from backend.extract.config import ExtractConfig
from backend.kit.lifecycle import StageFailed, StageRun, Stopped
from backend.kit import hostfacts
from backend.kit.hostfacts import check_host
from backend.kit.preflight import PreflightReport, check_modules, free_bytes, room_hint_for
from backend.kit.swap import ExtractionServer, SwapFailed, SwapStopped, describe, kill_group, run_swapped, tail
from backend.kit.swap_plan import PlanError, SwapPlan, check_server_layers, load_plan
from backend.kit.vllm_floor import UPGRADE, refusal, server_version
from backend.kit.verifier import (VerifierError, VerifierInfo, extraction_layer_ids, read_verifier,
                              resolve_aux_layers)

STAGE = "extract"
LOG_FILE = "extract.log"
REQUIRED_MODULES = ("speculators", "safetensors", "datasets", "openai", "aiohttp")
SIDES = (("train", "train_data", "train_hidden_states"), ("heldout", "heldout_data", "heldout_hidden_states"))


@dataclass(frozen=True)
class Side:
    name: str
    data: str  # the prepared dataset (Arrow dir)
    output_key: str
    rows: int
    tokens: int
    first_len: int  # row 0's length: the first file's expected sequence length
    max_len: int = 0
    lengths: tuple[int, ...] = field(default=(), repr=False, compare=False)  # each row's tokens


@dataclass
class Inputs:
    prepare: CompletedRun
    prepare_hash: str
    verifier: VerifierInfo
    aux_layer_ids: list[int]
    sides: list[Side]
    plan: SwapPlan | None
    estimate: disk.DiskEstimate | None = None

    @property
    def asked_layer_ids(self) -> list[int]:
        """The ids the server writes one state each for: the plan's, or (a server started by hand) what
        speculators expects, the aux ids plus the final layer."""
        if self.plan is not None:
            return list(self.plan.extract_layer_ids)
        return extraction_layer_ids(self.aux_layer_ids, self.verifier.num_layers)


def hs_indices(directory: str) -> set[int]:
    """The row indices that have an `hs_{i}.safetensors` in `directory` (as speculators lists them)."""
    found: set[int] = set()
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return found
    for name in names:
        if name.startswith("hs_") and name.endswith(".safetensors") and name[3:-12].isdigit():
            found.add(int(name[3:-12]))
    return found


def _read_side(name: str, path: str, output_key: str) -> Side:
    from datasets import load_from_disk

    try:
        data = load_from_disk(path)
    except Exception as exc:  # a missing or damaged dataset directory: say which
        raise InputError(f"the prepared {name} rows at {path} cannot be read ({type(exc).__name__}: {exc}); "
                         f"prepare again") from None
    lengths = data.with_format(None)["seq_len"] if "seq_len" in data.column_names else [
        len(r) for r in data.with_format(None)["input_ids"]]
    return Side(name=name, data=path, output_key=output_key, rows=len(lengths), tokens=int(sum(lengths)),
                first_len=int(lengths[0]) if lengths else 0, max_len=int(max(lengths)) if lengths else 0,
                lengths=tuple(int(n) for n in lengths))


def preflight(c: ExtractConfig) -> tuple[PreflightReport, Inputs | None]:
    """Every check before anything is touched; the inputs when all pass."""
    report = PreflightReport()
    check_modules(report, REQUIRED_MODULES)
    check_host(report)  # warnings: two vLLM installs, an old driver (the leftover on the port: the switch)
    try:
        prep = completed_run(c.work_dir, c.input_run, "prepare")
        prep.output("train_data")
        report.add("input_run", True, f"prepare run {prep.run_id} completed")
    except InputError as exc:
        report.add("input_run", False, str(exc), "name a completed prepare run with --input-run")
        prep = None
    try:
        info = read_verifier(c.verifier)
        report.add("verifier", True, f"{info.path}: {info.num_layers} layers, hidden {info.hidden_size}")
    except VerifierError as exc:
        report.add("verifier", False, str(exc), "set [drafter].verifier to the checkpoint directory on the host")
        info = None
    aux: list[int] | None = None
    if info is not None:
        try:
            aux = resolve_aux_layers(c.aux_layer_ids, info)
            report.add("aux_layer_ids", True, f"{aux} (of {info.num_layers} layers)")
        except VerifierError as exc:
            report.add("aux_layer_ids", False, str(exc), "fix [drafter].aux_layer_ids in the profile")
    plan = None
    if c.plan:
        try:
            plan = load_plan(c.plan)
            if aux is not None and plan.aux_layer_ids != aux:
                raise PlanError(f"the plan starts the extraction server with aux layer ids {plan.aux_layer_ids}, "
                                f"the stage extracts {aux}")
            if info is not None and aux is not None:  # (ids out of range are reported once, above)
                check_server_layers(plan, info)
            report.add("swap_plan", True, f"extraction server {plan.extractor_unit or '?'} at {plan.endpoint}")
        except PlanError as exc:
            report.add("swap_plan", False, str(exc), "start the stage from the console, which writes the plan")
            plan = None
    if info is not None and report.ok:
        check_vllm_version(report, info, (plan.endpoint if plan else c.endpoint or "").rstrip("/"),
                           swapped=plan is not None)
    if prep is None or info is None or aux is None or not report.ok:
        return report, None
    try:
        sides = [_read_side(name, prep.outputs[key], out) for name, key, out in SIDES if key in prep.outputs]
    except InputError as exc:
        report.add("prepared_rows", False, str(exc), "run prepare again")
        return report, None
    manifest = read_manifest(prep.path)
    inputs = Inputs(prepare=prep, prepare_hash=manifest.config_hash if manifest else "", verifier=info,
                    aux_layer_ids=aux, sides=sides, plan=plan)
    inputs.estimate, lengths = _estimate(c, inputs)
    e = inputs.estimate
    short = e.need_bytes + e.reserve_bytes - e.free_bytes
    report.add("disk_space", e.fits, e.detail(),
               "" if e.fits else e.refusal(lengths, online_ok=c.online_ok)
               + room_hint_for(c.work_dir, short, run_id=c.run_id, uses=(prep.run_id,)))
    return report, inputs


def check_vllm_version(report: PreflightReport, info: VerifierInfo, endpoint: str, swapped: bool) -> None:
    """The server at the endpoint (the baseline, before the swap stops it; or the extraction server given
    by --endpoint) runs a vLLM the verifier's extraction works on (backend/kit/vllm_floor.py). A server that
    does not answer its version is not refused here: the console asked it before starting the stage."""
    floor = info.vllm_floor()
    version, note = server_version(f"{endpoint}/version")
    if version is None:
        report.add("vllm_version", True, f"not checked ({note}); extraction needs vLLM >= {floor.text}")
        return
    who = "the baseline" if swapped else "the extraction server"
    why = refusal(version, floor, who)
    report.add("vllm_version", why is None, why or f"{who} runs vLLM {version} (extraction needs >= {floor.text})",
               UPGRADE.format(floor=floor.text))


def _estimate(c: ExtractConfig, inputs: Inputs) -> tuple[disk.DiskEstimate, list[int]]:
    """What the rows still missing their files will take (a resumed run needs only the rest), and those
    rows' lengths (what a shorter sequence length would clip)."""
    run = run_path(c.work_dir, c.run_id)
    rows = tokens = 0
    todo: list[int] = []
    for side in inputs.sides:
        have = hs_indices(os.path.join(run, side.output_key))
        if not have:
            rows, tokens = rows + side.rows, tokens + side.tokens
            todo.extend(side.lengths)
            continue
        missing = [n for i, n in enumerate(side.lengths) if i not in have]
        rows, tokens = rows + len(missing), tokens + sum(missing)
        todo.extend(missing)
    return disk.estimate(rows=rows, tokens=tokens, aux_layers=len(inputs.aux_layer_ids),
                         hidden_size=inputs.verifier.hidden_size, dtype_bytes=inputs.verifier.dtype_bytes,
                         free_bytes=free_bytes(run),
                         reserve_bytes=c.reserve_bytes, volume=run), todo


def identity_of(c: ExtractConfig, inputs: Inputs) -> dict[str, Any]:
    return {"input_run": inputs.prepare.run_id, "input_config_hash": inputs.prepare_hash,
            "verifier": inputs.verifier.path, "aux_layer_ids": inputs.aux_layer_ids}


class ExtractRunner:
    def __init__(self, config: ExtractConfig, inputs: Inputs):
        self.c = config
        self.inputs = inputs
        self.plan = inputs.plan
        self.endpoint = (self.plan.endpoint if self.plan else (config.endpoint or "")).rstrip("/")
        self.ctx: StageRun | None = None
        self.stop = asyncio.Event()
        self.stop_reason = ""
        self.server = ExtractionServer(self.plan, self.endpoint, progress=self.progress, emit=self.emit,
                                       stopped=self.stop.is_set, health_interval=config.health_interval,
                                       dead_after=config.dead_after, ready_phase="extracting")
        self.run_dir: RunDir | None = None
        self.started = time.monotonic()
        self.done_before = 0
        self.last_progress = 0.0
        self.phase = "starting"
        self.child: asyncio.subprocess.Process | None = None
        self.max_model_len: int | None = None  # what the extraction server reports in /v1/models
        self.child_log: Any = None
        self.width_checked: set[str] = set()  # sides whose first file's width was found right

    # -- events ----------------------------------------------------------------------------------------
    def emit(self, kind: str, **data: Any) -> None:
        if self.ctx is not None:
            self.ctx.emit(kind, **data)  # backend/kit/lifecycle.py: never takes the run down
        elif kind == "error":
            print(f"extract: {data.get('message')}", file=sys.stderr)

    @property
    def total(self) -> int:
        return sum(s.rows for s in self.inputs.sides)

    def _outdir(self, side: Side) -> str:
        assert self.run_dir is not None
        return self.run_dir.file(side.output_key)

    def done(self) -> int:
        return sum(len({i for i in hs_indices(self._outdir(s)) if i < s.rows}) for s in self.inputs.sides)

    def progress(self, phase: str | None = None, force: bool = False, **extra: Any) -> None:
        self.phase = phase or self.phase
        now = time.monotonic()
        if not force and now - self.last_progress < self.c.progress_interval:
            return
        self.last_progress = now
        done = self.done()
        elapsed = now - self.started
        self.emit("progress", phase=self.phase, done=done, total=self.total, failed=0,
                  rate=round((done - self.done_before) / elapsed, 3) if elapsed > 0 else 0.0, **extra)

    def _on_stop(self, name: str) -> None:
        self.stop_reason = self.stop_reason or name
        self.stop.set()

    # -- the run ---------------------------------------------------------------------------------------
    async def run(self) -> int:
        c, inputs = self.c, self.inputs
        manifest = Manifest(stage=STAGE, run_id=c.run_id, identity=identity_of(c, inputs),
                            settings={"endpoint": self.endpoint, "concurrency": c.concurrency,
                                      "plan": c.plan})
        ctx = self.ctx = StageRun(STAGE, c.run_id, work_dir=c.work_dir, manifest=manifest, fresh=c.fresh,
                                  mode="flag", failures=(SwapFailed,), stops=(SwapStopped,))
        ctx.on_stop(self._on_stop)
        # provenance: the extraction server's command line, as the plan starts it (or the one found listening)
        ctx.server_command = (self.plan.extractor.command or None) if self.plan else \
            hostfacts.serving_command(self.endpoint)
        ctx.stop_note = ("stopping; the extraction server is stopped and the baseline started again before "
                         "exiting" if self.plan else "stopping")
        ctx.summarize = self._summary
        ctx.report = report
        return await ctx.arun(self._body)

    async def _body(self, ctx: StageRun) -> None:
        self.run_dir = ctx.run_dir
        inputs = self.inputs
        self.done_before = self.done()
        ctx.start(total=self.total, already_done=self.done_before, aux_layer_ids=inputs.aux_layer_ids,
                  extract_layer_ids=inputs.asked_layer_ids, hidden_size=inputs.verifier.hidden_size,
                  estimate=inputs.estimate.to_dict() if inputs.estimate else None,
                  plan=self.plan.to_dict() if self.plan else None)
        try:
            # a resumed run whose files are all there needs no server: the baseline stays up
            missing = self.done_before < self.total
            if missing:
                # the child's imports (seconds) overlap the extraction server's load; it waits for the go
                self.child = await self._spawn_offline()
            await run_swapped(self.server, self._work, swap=missing)
        finally:
            await self._end_child()
            if self.plan:
                self._clean_staging()

    # -- the server (backend/kit/swap.py) ------------------------------------------------------------------
    def _check_lengths(self) -> None:
        """Every row must fit the extraction server's context with the one token it generates; a longer
        row would fail alone, late, and be skipped: say it now."""
        longest = max((s.max_len for s in self.inputs.sides), default=0)
        limit = self.max_model_len
        if limit is not None and longest + 1 > limit:
            raise StageFailed(f"the longest prepared row has {longest} tokens but the extraction server's "
                              f"max_model_len is {limit} (a row needs one more): prepare again with "
                              f"[prepare] seq_length <= {limit - 1}, or raise the server's --max-model-len")

    async def _work(self) -> None:
        """What runs with the extraction server up: extract, then check the files; the child always ends
        before the servers are swapped back."""
        try:
            if self.plan is not None and self.done() < self.total:
                self.max_model_len = self.server.max_model_len
                self._check_lengths()
            await self._extract()
            self._check_outputs()
        finally:
            await self._end_child()

    # -- extraction ------------------------------------------------------------------------------------
    def offline_argv(self) -> list[str]:
        c = self.c
        argv = [sys.executable, "-m", "backend.extract.offline", "--endpoint", f"{self.endpoint}/v1",
                "--concurrency", str(c.concurrency), "--request-timeout", f"{c.request_timeout:g}",
                "--max-retries", str(c.max_retries)]
        if c.validate_outputs:
            argv.append("--validate-outputs")
        argv.append("--wait-for-go")
        for side in self.inputs.sides:
            argv += ["--pair", side.data, self._outdir(side)]
        return argv

    async def _spawn_offline(self) -> asyncio.subprocess.Process:
        assert self.run_dir is not None
        env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
        if self.child_log is None:
            self.child_log = open(self.run_dir.file(LOG_FILE), "ab")
        return await asyncio.create_subprocess_exec(
            *self.offline_argv(), stdin=asyncio.subprocess.PIPE,
            stdout=self.child_log, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True)

    async def _extract(self) -> None:
        c = self.c
        assert self.run_dir is not None
        if self.stop.is_set():
            raise Stopped(self.stop_reason)
        if not self.plan:
            if not await self.server.answers():
                raise StageFailed(f"nothing healthy answers at {self.endpoint}/health and /v1/models: start the "
                                  f"extraction server first (or let the stage swap it in with --plan)")
            self.max_model_len = self.server.max_model_len
            self._check_lengths()
        self.progress("extracting", force=True)
        if self.done() == self.total:
            return  # a resumed run that had finished its files
        proc = self.child
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it exited already (a failed import): its exit status and log say why, below
        while True:
            try:
                await asyncio.wait_for(proc.wait(), c.health_interval)
                break
            except asyncio.TimeoutError:
                pass
            self.progress("extracting")
            self._check_widths()
            if self.stop.is_set():
                await self._end_child()
                raise Stopped(self.stop_reason)
            if await self.server.lost():
                await self._end_child()
                raise StageFailed(f"the extraction server died midway ({self.done()} of {self.total} rows "
                                  f"done): {await self.server.why_dead()}. Start the run again to resume")
        self.progress("extracting", force=True)
        if proc.returncode != 0 and not (await self.server.healthy() and await self.server.alive()):
            # generate-offline-data gave up on a server that is gone: say that, not its exit status
            raise StageFailed(f"the extraction server died midway ({self.done()} of {self.total} rows done): "
                              f"{await self.server.why_dead()}. Start the run again to resume")
        if proc.returncode != 0:
            log = self.run_dir.file(LOG_FILE)
            with open(log, "rb") as f:
                f.seek(max(0, os.path.getsize(log) - 8192))
                tail = tail(f.read(), 3)
            raise StageFailed(f"speculators generate-offline-data exited {proc.returncode} ({tail}); "
                              f"see {LOG_FILE} in the run directory")

    async def _end_child(self) -> None:
        """Stop the generate-offline-data child if it still runs: end of input when it waits for the go,
        else SIGINT (it stops between files), SIGKILL after the grace period."""
        proc = self.child
        if proc is None or proc.returncode is not None:
            self._close_child_log()
            return
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()  # never told to go: it exits on end of input
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except asyncio.TimeoutError:
                pass
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                await asyncio.wait_for(proc.wait(), self.c.stop_grace_s)
            except asyncio.TimeoutError:
                kill_group(proc.pid)
                await proc.wait()
        self._close_child_log()

    def _close_child_log(self) -> None:
        if self.child_log is not None:
            self.child_log.close()
            self.child_log = None

    def _widths_wrong(self, shape: list[int], seq_len: int | None = None) -> str | None:
        """Why a file of this shape is not what the server was asked for, or None when it is."""
        asked, hidden = self.inputs.asked_layer_ids, self.inputs.verifier.hidden_size
        expected = [len(asked), hidden] if seq_len is None else [seq_len, len(asked), hidden]
        if (shape[1:] if seq_len is None else shape) == expected:
            return None
        got = shape[1] if len(shape) == 3 else None
        what = (f"{got} hidden states per token, expected {len(asked)}" if got is not None and got != len(asked)
                else f"hidden states of shape {shape}, expected [{seq_len if seq_len is not None else 'seq'}, "
                     f"{len(asked)}, {hidden}]")
        return (f"the extraction server wrote {what} (layer ids {asked} asked for: aux layers "
                f"{self.inputs.aux_layer_ids} + the final layer {self.inputs.verifier.num_layers} of a "
                f"{hidden}-wide verifier): was it started with those ids and this verifier? Files of another "
                f"width cannot be trained on; remove the run's hidden states and extract again")

    def _check_widths(self) -> None:
        """The first file of each side, as soon as one is complete: a server that writes another number of
        states (or another width) fails the run now, not after hours of extraction."""
        from safetensors import safe_open

        for side in self.inputs.sides:
            if side.name in self.width_checked:
                continue
            have = sorted(hs_indices(self._outdir(side)))
            if not have:
                continue
            try:
                with safe_open(os.path.join(self._outdir(side), f"hs_{have[0]}.safetensors"), framework="pt") as f:
                    shape = list(f.get_slice("hidden_states").get_shape())
            except Exception:  # still being copied into place (see generate-offline-data): look again later
                continue
            why = self._widths_wrong(shape)
            if why:
                raise StageFailed(why)
            self.width_checked.add(side.name)

    def _check_outputs(self) -> None:
        from safetensors import safe_open

        for side in self.inputs.sides:
            out = self._outdir(side)
            have = hs_indices(out)
            missing = [i for i in range(side.rows) if i not in have]
            if missing:
                raise StageFailed(f"{len(missing)} of {side.rows} {side.name} rows have no hidden states (their "
                                  f"requests failed, e.g. row {missing[0]}: see {LOG_FILE}); start the run again "
                                  f"to redo just those")
            if not side.rows:
                continue
            with safe_open(os.path.join(out, "hs_0.safetensors"), framework="pt") as f:
                shape = list(f.get_slice("hidden_states").get_shape())
            why = self._widths_wrong(shape, side.first_len)
            if why:
                raise StageFailed(why)

    def _clean_staging(self) -> None:
        """The connector's staging dir is this run's own: files left there (a request whose answer never
        came) are removed once the extraction server is gone."""
        storage = self.plan.storage_path if self.plan else ""
        if not storage or not os.path.isdir(storage):
            return
        for name in os.listdir(storage):
            if name.endswith((".safetensors", ".lock")) or ".tmp-" in name:
                try:
                    os.unlink(os.path.join(storage, name))
                except OSError:
                    pass
        try:
            os.rmdir(storage)
        except OSError:
            pass

    # -- the end ---------------------------------------------------------------------------------------
    def _summary(self, status: str, error: str | None) -> dict[str, Any]:
        assert self.run_dir is not None
        inputs = self.inputs
        outputs: dict[str, str] = {}
        if status == "completed":
            for side in inputs.sides:
                outputs[side.output_key] = self._outdir(side)
                outputs[f"{side.name}_data"] = side.data
            if "token_freq" in inputs.prepare.outputs:
                outputs["token_freq"] = inputs.prepare.outputs["token_freq"]
        written = sum(e.stat().st_size for s in inputs.sides if os.path.isdir(self._outdir(s))
                      for e in os.scandir(self._outdir(s)) if e.name.startswith("hs_"))
        summary: dict[str, Any] = {
            "stage": STAGE, "run_id": self.c.run_id, "status": status, "input_run": inputs.prepare.run_id,
            "verifier": inputs.verifier.path, "aux_layer_ids": inputs.aux_layer_ids,
            "extract_layer_ids": inputs.asked_layer_ids,
            "hidden_size": inputs.verifier.hidden_size, "num_layers": inputs.verifier.num_layers,
            "done": self.done(), "total": self.total, "failed": 0,
            "rows": {s.name: s.rows for s in inputs.sides}, "tokens": {s.name: s.tokens for s in inputs.sides},
            "bytes_written": written, "endpoint": self.endpoint,
            "estimate": inputs.estimate.to_dict() if inputs.estimate else None,
            "elapsed_s": round(time.monotonic() - self.started, 3), "outputs": outputs,
        }
        if self.plan:
            summary["swap"] = self.server.record.to_dict()
        if status == "stopped":
            error = f"received {self.stop_reason or 'a stop signal'}: stopped; start the run again to resume"
        if error:
            summary["error"] = error
        return summary


def report(summary: dict[str, Any]) -> str:
    rows = ", ".join(f"{n} {side}" for side, n in summary["rows"].items())
    lines = [f"extract {summary['run_id']}: {summary['status']} ({summary['done']} of {summary['total']} rows: "
             f"{rows}; aux layers {summary['aux_layer_ids']}, hidden {summary['hidden_size']}, "
             f"{disk.gb(summary['bytes_written'])} written)"]
    swap = summary.get("swap")
    if swap:
        lines.append(f"  {describe(swap)}")
    return "\n".join(lines)
