"""The command lines of the data stages (prepare, extract) as the profile sets them up. Pure functions.

The console runs these on the host detached, like the generation stage; the extract stage's swap plan is
console/control/extraction.py.
"""
from __future__ import annotations

from typing import Sequence

from console.profile import Profile


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
    if fresh:
        argv.append("--fresh")
    if preflight_only:
        argv.append("--preflight-only")
    return argv


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
