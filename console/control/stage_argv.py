"""The command line of every stage program as the profile sets it up (pure functions, one per stage).

The console runs these on the host detached (console/control/launch.py), alone or chained in a pipeline
run (console/control/pipeline.py); the extract stage's server swap plan is console/control/extraction.py.
"""
from __future__ import annotations

import json
from typing import Sequence

from backend.kit.redact import redacted
from console.control.server_argv import server_command
from console.profile import Profile, check_path


class StageArgError(ValueError):
    """A stage cannot be started as the profile and options say (the message says what to set)."""


def check_host_path(value: str, what: str) -> str:
    """A path on the host given on the console's command line: absolute, no control characters."""
    if problem := check_path(value):
        raise StageArgError(f"{what} {value!r}: expected {problem}")
    return value


def generate_argv(profile: Profile, run_id: str, *, dataset: str | None = None, limit: int | None = None,
                  fresh: bool = False, preflight_only: bool = False, api_key_path: str | None = None) -> list[str]:
    g = profile.generate
    dataset = dataset or (None if g.sources else g.dataset)
    if not dataset and not g.sources:
        raise StageArgError("no dataset: set [generate].dataset (or [[generate.sources]]) in the profile or pass "
                            "--dataset PATH")
    if dataset:
        selection = ["--dataset", dataset, "--limit", str(limit or g.samples)]
    else:  # several sources, a seeded sample of each (backend/generate/sources.py)
        selection = ["--sources", json.dumps(g.sources, separators=(",", ":")),
                     "--selection-seed", str(g.selection_seed)]
        if any("share" in s for s in g.sources):
            selection += ["--sample-total", str(limit or g.samples)]
    argv = [profile.paths.python, "-m", "backend.generate",
            *selection[:2], "--work-dir", profile.paths.work_dir, "--run-id", run_id,
            "--endpoint", f"http://127.0.0.1:{profile.server.port}", "--model", profile.server.model_id,
            "--max-tokens", str(g.max_tokens), "--long-prompt", g.long_prompt, "--concurrency", str(g.concurrency),
            "--request-timeout", f"{g.request_timeout_s:g}", "--temperature", f"{g.temperature:g}",
            "--top-p", f"{g.top_p:g}", "--return-token-ids", g.return_token_ids,
            "--max-retries", str(g.max_retries), *selection[2:],
            "--expect-reasoning" if profile.server.expect_reasoning else "--no-expect-reasoning"]
    if g.chat_template_kwargs:
        argv += ["--chat-template-kwargs", json.dumps(g.chat_template_kwargs, separators=(",", ":"))]
    if not g.smoke:
        argv.append("--no-smoke")
    # provenance where the host hides the listening process (another user's): the profile's baseline, redacted
    argv += ["--server-command", json.dumps(redacted(server_command(profile)), separators=(",", ":"))]
    smi = nvidia_smi_prefix(profile)
    if smi != ["nvidia-smi"]:  # the smoke's clock-throttle reasons come from the table the telemetry reads
        argv += ["--nvidia-smi", json.dumps(smi)]
    if api_key_path:
        argv += ["--api-key-file", api_key_path]
        if not preflight_only:  # the run reads it after its preflight: the run's own copy, removed once read
            argv.append("--remove-api-key-file")
    if fresh:
        argv.append("--fresh")
    if preflight_only:
        argv.append("--preflight-only")
    return argv


def verifier_path(profile: Profile) -> str:
    """The verifier checkpoint on the host: [drafter].verifier, else the model the server loads."""
    return profile.drafter.verifier or profile.server.model_path


def extract_argv(profile: Profile, run_id: str, input_run: str, *, plan_file: str | None,
                 aux_layer_ids: Sequence[int] | None = None, fresh: bool = False,
                 preflight_only: bool = False) -> list[str]:
    """`python -m backend.extract ...` for the profile; the plan file swaps the servers, without one the
    stage uses an extraction server already answering on the server's port."""
    e = profile.extract
    ids = list(aux_layer_ids or profile.drafter.aux_layer_ids)
    argv = [profile.paths.python, "-m", "backend.extract", "--work-dir", profile.paths.work_dir,
            "--run-id", run_id, "--input-run", input_run, "--verifier", verifier_path(profile),
            "--concurrency", str(e.concurrency), "--request-timeout", f"{e.request_timeout_s:g}",
            "--max-retries", str(e.max_retries), "--reserve-bytes", str(int(e.reserve_gib * 2**30)),
            "--validate-outputs" if e.validate_outputs else "--no-validate-outputs"]
    if ids:
        argv += ["--aux-layer-ids", ",".join(str(i) for i in ids)]
    argv += ["--plan", plan_file] if plan_file else ["--endpoint", f"http://127.0.0.1:{profile.server.port}"]
    if online_training_allowed(profile):
        argv.append("--online-ok")  # only then may a disk refusal advise online training
    if fresh:
        argv.append("--fresh")
    if preflight_only:
        argv.append("--preflight-only")
    return argv


def online_training_allowed(profile: Profile) -> bool:
    """Whether the host's GPU plan lets train run online (the extraction server and the trainer on GPUs
    apart): not on a host whose baseline holds every GPU the trainer asks for (the seed host's TP8)."""
    from console.control.gpu_plan import OwnershipError, gpu_plan

    try:
        gpu_plan(profile, ["train"], online=True, chain=False)
    except OwnershipError:
        return False
    return True


def prepare_argv(profile: Profile, run_id: str, input_run: str, *, fresh: bool = False) -> list[str]:
    """`python -m backend.prepare ...` for the profile; the render endpoint is the baseline server (used
    only when the generation run has no exact token ids)."""
    p = profile.prepare
    argv = [profile.paths.python, "-m", "backend.prepare", "--work-dir", profile.paths.work_dir,
            "--run-id", run_id, "--input-run", input_run, "--verifier", verifier_path(profile),
            "--seq-length", str(p.seq_length), "--heldout-fraction", f"{p.heldout_fraction:g}",
            "--heldout-min", str(p.heldout_min), "--source", p.source,
            "--render-endpoint", f"http://127.0.0.1:{profile.server.port}",
            "--render-concurrency", str(p.render_concurrency)]
    if p.minimum_valid_tokens is not None:
        argv += ["--minimum-valid-tokens", str(p.minimum_valid_tokens)]
    if profile.drafter.trust_remote_code:
        argv.append("--trust-remote-code")
    if fresh:
        argv.append("--fresh")
    return argv


def train_argv(profile: Profile, run_id: str, input_run: str | None, *, fresh: bool = False,
               preflight_only: bool = False, plan_file: str | None = None) -> list[str]:
    """`python -m backend.train ...`: the [train] settings, the [drafter]'s verifier and draft tokens; the
    aux layer ids come with the extract run it trains on. With a swap plan it trains online on a prepare
    run: the plan's extraction server (its aux layer ids, the served model's id) answers for the hidden
    states, in the baseline's place for the duration."""
    argv = [profile.paths.python, "-m", "backend.train", "--work-dir", profile.paths.work_dir, "--run-id", run_id,
            "--verifier", verifier_path(profile),
            "--speculative-tokens", str(profile.drafter.num_speculative_tokens), *profile.train.stage_args()]
    if input_run:
        argv += ["--input-run", input_run]
    if plan_file:
        argv += ["--plan", plan_file, "--served-model", profile.server.model_id]
    smi = nvidia_smi_prefix(profile)
    if smi != ["nvidia-smi"]:  # the stage's GPU check reads the table the telemetry reads
        argv += ["--nvidia-smi", json.dumps(smi)]
    if profile.host.simulated and profile.train.gpus != 0:
        argv.append("--simulated-gpus")
    if fresh:
        argv.append("--fresh")
    if preflight_only:
        argv.append("--preflight-only")
    return argv


def nvidia_smi_prefix(profile: Profile) -> list[str]:
    """How this host's GPUs are asked: the profile's [gpus] command without its query and format."""
    return [a for a in profile.gpus.command if not a.startswith(("--query-gpu", "--format"))]


def verify_argv(profile: Profile, run_id: str, input_run: str | None, *, fresh: bool = False,
                plan_file: str | None = None, checkpoint: str | None = None,
                served_context: int | None = None) -> list[str]:
    """`python -m backend.verify ...`: k draft tokens as the drafter will be served, on held-out samples
    (with a swap plan, those of an online train run come from the plan's extraction server).
    `checkpoint` verifies another drafter (a fetched one) on the train run's held-out rows."""
    argv = [profile.paths.python, "-m", "backend.verify", "--work-dir", profile.paths.work_dir, "--run-id", run_id,
            "--speculative-tokens", str(profile.drafter.num_speculative_tokens),
            "--samples", str(profile.verify.samples)]
    if input_run:
        argv += ["--input-run", input_run]
    if plan_file:
        argv += ["--plan", plan_file, "--served-model", profile.server.model_id]
    if checkpoint:
        argv += ["--checkpoint", checkpoint, "--verifier", verifier_path(profile)]
    if served_context is not None:  # the baseline's --max-model-len: verify warns past the drafter's
        argv += ["--served-context", str(served_context)]
    if fresh:
        argv.append("--fresh")
    return argv


def fetch_drafter_argv(profile: Profile, run_id: str, *, token_path: str | None = None,
                       fresh: bool = False) -> list[str]:
    """`python -m backend.fetch_drafter ...`: [bench].third_drafter downloaded on the host, converted against
    the verifier when it is not in speculators format. The token travels as a file, never as an argument."""
    b = profile.bench
    if not b.third_drafter:
        raise StageArgError("no drafter to fetch: set [bench].third_drafter in the profile to a published EAGLE-3 "
                            "drafter for this model (owner/name on the Hub)")
    argv = [profile.paths.python, "-m", "backend.fetch_drafter", "--work-dir", profile.paths.work_dir,
            "--run-id", run_id, "--repo", b.third_drafter, "--revision", b.third_revision,
            "--verifier", verifier_path(profile)]
    if b.hub_endpoint:
        argv += ["--endpoint", b.hub_endpoint]
    if token_path:  # the console's copy: the stage deletes it once read
        argv += ["--token-file", token_path, "--remove-token-file"]
    if fresh:
        argv.append("--fresh")
    return argv


def chain_argv(profile: Profile, run_id: str, plan_file: str, *, fresh: bool = False,
               secret_files: Sequence[str] = ()) -> list[str]:
    """`secret_files`: the console's copies of secrets its stages read, which the chain removes at its end."""
    argv = [profile.paths.python, "-m", "backend.chain", "--work-dir", profile.paths.work_dir, "--run-id", run_id,
            "--plan", plan_file, *secret_file_args(secret_files)]
    return argv + (["--fresh"] if fresh else [])


def secret_file_args(paths: Sequence[str]) -> list[str]:
    """--secret-file F for each: what a program that runs the readers removes at its end."""
    return [arg for path in paths for arg in ("--secret-file", path)]


def latest_argv(profile: Profile, stage: str) -> list[str]:
    """Asks the host for the run a stage takes by default: the latest completed run of `stage` (backend/ask.py)."""
    return [profile.paths.python, "-m", "backend.ask", "latest", "--work-dir", profile.paths.work_dir,
            "--stage", stage]


def vllm_floor_argv(profile: Profile) -> list[str]:
    """Asks the host the oldest vLLM the verifier's extraction server runs on and the baseline's own
    version (backend/ask.py vllm-floor), before a swap stops the baseline."""
    return [profile.paths.python, "-m", "backend.ask", "vllm-floor", "--verifier", verifier_path(profile),
            "--url", f"http://127.0.0.1:{profile.server.port}/version"]


def aux_layers_argv(profile: Profile) -> list[str]:
    """Asks the host which aux layer ids the verifier takes ([drafter].aux_layer_ids checked, or vLLM's
    default for its layer count; backend/ask.py): the extraction server's command line needs them."""
    return [profile.paths.python, "-m", "backend.ask", "aux-layers", "--verifier", verifier_path(profile),
            "--ids", ",".join(str(i) for i in profile.drafter.aux_layer_ids)]
