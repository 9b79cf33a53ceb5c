"""The verify stage: a train run's checkpoint -> checks as vLLM will load it -> offline acceptance.

`python -m backend.verify --work-dir W --input-run TRAIN_RUN [--speculative-tokens K] [--samples N]`
checks the checkpoint (backend/drafter/checks.py), loads it, and measures offline acceptance
(backend/drafter/acceptance.py) on the held-out rows the drafter never trained on (the prepare run's
heldout split, with the extract run's hidden states, or fetched from an extraction server with
--vllm-endpoint; with --plan the stage swaps that server in for the baseline itself, backend/kit/swap.py),
next to an untrained draft of the same shape, and beside it vLLM's own count when a bench pair of the same
checkpoint has run (backend/verify/online.py). Writes verify.json in its run
directory, prints a table, and the finish event carries the same report as its summary.

Exit codes (backend/contract/exitcodes.py): 0 the checkpoint passed every check (acceptance is reported, not
judged) or the run was stopped (SIGTERM; with a plan the baseline is back), 1 a check failed or acceptance
could not be measured, 2 unusable arguments or input run (nothing was written).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from backend.contract.lookup import CompletedRun, InputError, completed_run, latest_completed
from backend.contract.runs import Manifest, write_json_atomic
from backend.drafter import checkpoints as ck
from backend.drafter import checks
from backend.drafter.verifier import VerifierError, inspect_verifier
from backend.kit.lifecycle import Stopped, StageRun, refuse
from backend.kit.preflight import PreflightReport
from backend.verify.online import vllm_count
from backend.verify.report import table

STAGE = "verify"
REPORT_FILE = "verify.json"
FROM_VERIFIER = frozenset({"embed_tokens.weight"})  # a draft tensor the loader fills from the verifier


@dataclass
class VerifyConfig:
    work_dir: str = "."
    run_id: str = "verify"
    input_run: str | None = None  # a train run; default the latest completed one
    checkpoint: str | None = None  # a checkpoint dir instead of the train run's best
    verifier: str | None = None  # default: the train run's verifier
    speculative_tokens: int | None = None  # default: the train run's
    samples: int = 64
    vllm_endpoint: str | None = None  # held-out hidden states from an extraction server
    served_model: str | None = None  # the id that server serves (default: the verifier path)
    plan: str | None = None  # the swap plan: the extraction server in the baseline's place while sampling
    seed: int = 0
    draft_cost: float | None = None  # a draft step against a verifier step (default: a bench's, else assumed)
    fresh: bool = False
    served_context: int | None = None  # the baseline's --max-model-len (backend/drafter/context.py)


def parse_args(argv: list[str] | None) -> VerifyConfig:
    p = argparse.ArgumentParser(prog="python -m backend.verify", description=__doc__.split("\n")[0])
    p.add_argument("--work-dir", default=".")
    p.add_argument("--run-id", default="verify")
    p.add_argument("--input-run", help="the train run whose checkpoint to verify (default: the latest completed)")
    p.add_argument("--checkpoint", help="verify this checkpoint directory instead of the train run's best")
    p.add_argument("--verifier", help="the verifier's directory on this host (default: the train run's)")
    p.add_argument("--speculative-tokens", type=int, help="k draft tokens (default: the train run's)")
    p.add_argument("--samples", type=int, default=64, help="held-out samples to measure on")
    p.add_argument("--vllm-endpoint", help="fetch held-out hidden states from this extraction server (…/v1)")
    p.add_argument("--served-model", help="the model id the extraction server serves (default: the verifier path)")
    p.add_argument("--plan", help="swap plan JSON: when the train run has no held-out hidden states (it trained "
                                  "online), stop the baseline, serve the extraction server while the held-out "
                                  "samples are fetched, and start the baseline again")
    p.add_argument("--seed", type=int, default=0, help="seed of the untrained baseline draft")
    p.add_argument("--draft-cost", type=float, help="one draft step's cost against one verifier step, for the K "
                                                    "table (default: from the latest bench, else assumed)")
    p.add_argument("--fresh", action="store_true", help="archive an existing run directory and start over")
    p.add_argument("--served-context", type=int, help="the context the server serves (its --max-model-len): a "
                   "warning when it is longer than the drafter's max_position_embeddings")
    args = p.parse_args(argv)
    config = VerifyConfig(**vars(args))
    if config.draft_cost is not None and not 0 <= config.draft_cost < 100:
        p.error(f"--draft-cost must be in [0, 100), got {config.draft_cost}")
    if config.served_context is not None and config.served_context < 1:
        p.error(f"--served-context must be >= 1, got {config.served_context}")
    if config.samples < 1:
        p.error(f"--samples must be >= 1, got {config.samples}")
    if config.speculative_tokens is not None and not 1 <= config.speculative_tokens <= 32:
        p.error(f"--speculative-tokens must be 1..32, got {config.speculative_tokens}")
    return config


def heldout_samples(run: CompletedRun, info: Any, limit: int, endpoint: str | None,
                    served_model: str | None = None) -> Iterator[dict[str, Any]]:
    """Held-out rows with their hidden states, as speculators' own dataset reads them."""
    from backend.drafter.samples import heldout_items

    data = run.output("heldout_data")
    hs = run.outputs.get("heldout_hidden_states")
    if hs is None and endpoint is None:
        raise InputError(f"train run {run.run_id} has no held-out hidden states (it trained online): pass "
                         f"--vllm-endpoint with the extraction server")
    for path in (data, hs):
        if path is not None and not os.path.isdir(path):
            raise InputError(f"train run {run.run_id}: {path} is missing on this host")
    yield from heldout_items(data, hs, limit, endpoint=endpoint, model=served_model or info.path,
                             cache_dir=os.path.join(run.path, "hs-cache"))


def plan_server_command(path: str) -> list[str] | None:
    """The extraction server's command line in the swap plan (provenance); None when the plan cannot be
    read here (fetch_samples refuses it with the reason)."""
    from backend.kit.swap_plan import PlanError, load_plan

    try:
        return load_plan(path).extractor.command or None
    except (PlanError, OSError, ValueError):
        return None


def fetch_samples(run: CompletedRun, info: Any, c: VerifyConfig, ctx: StageRun) -> list[dict[str, Any]]:
    """The held-out samples; an online train run's come from the plan's extraction server, swapped in for
    the baseline while they are fetched (backend/kit/swap.py). A stop during the swap ends the fetch and the
    baseline is started again before the run finishes as stopped."""
    if not c.plan or run.outputs.get("heldout_hidden_states"):
        return list(heldout_samples(run, info, c.samples, c.vllm_endpoint, c.served_model))
    from backend.kit.swap import ExtractionServer, SwapFailed, SwapStopped, describe, run_swapped_blocking
    from backend.kit.swap_plan import PlanError, check_server_layers, load_plan

    try:
        plan = load_plan(c.plan)
        check_server_layers(plan, info)  # one state per id comes back: the last must be the final layer
    except PlanError as exc:
        raise InputError(str(exc)) from None
    lost: list[str] = []
    server = ExtractionServer(plan, progress=lambda phase, force=False, **extra: ctx.emit(
        "progress", phase=phase, **extra), emit=ctx.emit, stopped=lambda: bool(ctx.stopping),
        ready_phase="sampling")

    def sample() -> list[dict[str, Any]]:
        out = []
        for item in heldout_samples(run, info, c.samples, c.vllm_endpoint or f"{plan.endpoint}/v1", c.served_model):
            ctx.check_stop()
            out.append(item)
        return out

    try:
        with ctx.shielded():  # a stop is seen between steps, so the swap back always runs
            return run_swapped_blocking(server, sample, lost.append)
    except SwapStopped:
        raise Stopped(ctx.stopping or "stop") from None
    except SwapFailed as exc:
        raise InputError(f"the held-out hidden states could not be fetched: {exc}") from None
    except Exception as exc:
        why = f" (the extraction server died: {lost[0]})" if lost else ""
        raise InputError(f"the held-out hidden states could not be fetched: {type(exc).__name__}: {exc}{why}") from None
    finally:
        print(f"verify: {describe(server.record.to_dict())}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from backend.drafter.context import context_warning, drafter_context

    c = parse_args(argv)
    try:
        run = completed_run(c.work_dir, c.input_run, "train") if c.input_run else latest_completed(c.work_dir, "train")
        ckpt = c.checkpoint or run.output("checkpoint")
        if not os.path.isdir(ckpt):
            raise InputError(f"checkpoint {ckpt} does not exist on this host")
        verifier = c.verifier or run.summary.get("verifier")
        if not isinstance(verifier, str):
            raise InputError(f"train run {run.run_id} does not name its verifier: pass --verifier")
        info = inspect_verifier(verifier)
        config = ck.read_config(ckpt)
        keys = checks.header(ckpt)
    except (InputError, VerifierError, ck.CheckpointError) as exc:
        return refuse("verify", exc)
    k = c.speculative_tokens or run.summary.get("speculative_tokens") or checks.trained_k(config) or 3
    identity = {"input_run": run.run_id, "checkpoint": os.path.realpath(ckpt), "verifier": info.path,
                "speculative_tokens": k, "samples": c.samples, "seed": c.seed}
    ctx = StageRun(STAGE, c.run_id, work_dir=c.work_dir, fresh=c.fresh, prog="verify",
                   manifest=Manifest(stage=STAGE, run_id=c.run_id, identity=identity,
                                     settings={"vllm_endpoint": c.vllm_endpoint}))
    started = time.monotonic()
    report: dict[str, Any] = {"stage": STAGE, "run_id": c.run_id, "checkpoint": os.path.realpath(ckpt),
                              "train_run": run.run_id, "verifier": info.path, "k": k}
    pre = PreflightReport()

    ctx.checkpoint = ckpt  # the drafter checked: its hash in the host facts
    drafter_len = drafter_context(config)
    report["context"] = {"served": c.served_context, "drafter": drafter_len}
    if warning := context_warning(c.served_context, drafter_len, os.path.realpath(ckpt)):
        report["warnings"] = [warning]
        print(f"verify: warning: {warning}", file=sys.stderr)
    ctx.server_command = plan_server_command(c.plan) if c.plan else None  # online: the extraction server

    def body(ctx: StageRun) -> None:
        ctx.start(total=c.samples)
        checks.check_format(pre, ckpt, config, keys)
        checks.check_layer_ids(pre, config, info, keys)
        checks.check_vocab(pre, ckpt, config, info, keys)
        checks.check_verifier(pre, ckpt, config, info)
        if pre.ok:
            try:
                report["acceptance"] = measure(ckpt, info, run, k, c, ctx, pre, keys)
                report["k_table"] = k_evidence(report["acceptance"]["trained"]["per_position"], k, c).to_dict()
                online = vllm_count(c.work_dir, ckpt, k)  # a bench of this checkpoint ran before: vLLM's count
                if online is not None:
                    report["online"] = online
            except InputError as exc:
                report["error"] = str(exc)
            except Exception as exc:  # a checkpoint that does not load is what this stage exists to catch
                pre.add("weights_load", False, f"{type(exc).__name__}: {exc}", "retrain, or check the checkpoint files")

    def summarize(status: str, error: str | None) -> dict[str, Any]:
        report["checks"] = [asdict(x) for x in pre.checks]
        if error and "error" not in report:
            report["error"] = error
        elif status != "stopped" and not pre.ok and "error" not in report:
            report["error"] = pre.failures()
        report["ok"] = status == "completed" and pre.ok and "error" not in report
        report["status"] = "completed" if report["ok"] else status if status == "stopped" else "failed"
        report["elapsed_s"] = round(time.monotonic() - started, 2)
        report["outputs"] = {"report": ctx.file(REPORT_FILE), "checkpoint": os.path.realpath(ckpt)}
        # another drafter (a published one) measured on this train run's rows: never the one `serve-drafter` picks
        report["external_checkpoint"] = c.checkpoint is not None
        try:
            write_json_atomic(ctx.file(REPORT_FILE), report)
        except OSError as exc:
            print(f"verify: could not write {REPORT_FILE}: {exc}", file=sys.stderr)
        return report

    ctx.summarize = summarize
    ctx.report = table
    return ctx.run(body)


def k_evidence(per_position: list[float], k: int, c: VerifyConfig) -> Any:
    """The K table (backend/verify/k_table.py) at the draft cost given, a bench's, or the assumed one."""
    from backend.verify import k_table as kt

    if c.draft_cost is not None:
        return kt.k_table(per_position, c.draft_cost, "as given (--draft-cost)")
    try:
        bench = latest_completed(c.work_dir, "bench", lambda r: isinstance(r.summary.get("comparison"), dict))
        served = kt.served_k(bench.summary["comparison"]) or k  # a bench of several K served others
        cost = kt.draft_cost_from_bench(bench.summary["comparison"], served)
    except (InputError, OSError):
        cost, bench = None, None
    if cost is not None and bench is not None:
        return kt.k_table(per_position, round(cost, 4), f"measured by bench run {bench.run_id} at k={served}")
    return kt.k_table(per_position, kt.ASSUMED_DRAFT_COST, "assumed: no bench with the drafter yet")


def measure(ckpt: str, info: Any, run: CompletedRun, k: int, c: VerifyConfig, ctx: StageRun,
            pre: PreflightReport, keys: dict[str, list[int]]) -> dict[str, Any]:
    import torch

    from backend.drafter.acceptance import offline_acceptance
    from backend.drafter.draft import load_draft, saved_tensor_names, untrained_draft, verifier_head

    trained = load_draft(ckpt, info)
    # published drafters (speculators convert, SpecForge) often leave the embedding out: speculators and vLLM
    # take it from the verifier then, so its absence is no gap
    missing = sorted(saved_tensor_names(trained) - set(keys) - FROM_VERIFIER)
    if missing:
        pre.add("weights_load", False, f"the checkpoint lacks {len(missing)} draft tensors ({', '.join(missing[:4])})",
                "retrain: the save was incomplete")
        raise InputError(f"checkpoint {ckpt} is incomplete")
    bad = [n for n, t in trained.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    pre.add("weights_load", not bad, f"speculators loads it; all {len(keys)} tensors present"
            + ("" if not bad else f"; non-finite values in {', '.join(bad[:4])}"), "retrain: the weights diverged")
    if bad:
        raise InputError(f"checkpoint {ckpt} has non-finite weights")
    baseline = untrained_draft(ckpt, info, seed=c.seed)
    head = verifier_head(trained, info)
    ctx.check_stop()
    samples = fetch_samples(run, info, c, ctx)
    if not samples:
        raise InputError(f"train run {run.run_id}: no held-out samples to measure on")
    with torch.no_grad():
        a = offline_acceptance(trained, head, samples, k)
        ctx.emit("progress", done=len(samples), total=len(samples), phase="trained",
                    mean_acceptance_length=round(a.mean_acceptance_length, 4))
        b = offline_acceptance(baseline, head, samples, k)
    return {"k": k, "trained": a.to_dict(), "untrained": b.to_dict()}
