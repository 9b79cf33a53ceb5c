"""The bench stage's command line (python -m backend.bench) as the profile sets it up. Pure."""
from __future__ import annotations

from console.profile import Profile


def bench_argv(profile: Profile, run_id: str, *, label: str, input_run: str | None = None,
               prompts: str | None = None, baseline_run: str | None = None, third_run: str | None = None,
               api_key_path: str | None = None, vllm_python: str | None = None) -> list[str]:
    """Bench the server on the profile's port: prompts from `prompts` (else [bench].dataset, else the
    held-out rows of `input_run`); compared with `baseline_run` (and `third_run`) when given; `vllm bench
    serve` through `vllm_python` (the served vLLM's interpreter, vllm_cmdline.server_python) when given."""
    b = profile.bench
    source = prompts or b.dataset
    if not source and not input_run:
        raise ValueError("no prompts: set [bench].dataset, or give the prepare run whose held-out rows to use")
    argv = [profile.paths.python, "-m", "backend.bench", "--work-dir", profile.paths.work_dir, "--run-id", run_id,
            "--endpoint", f"http://127.0.0.1:{profile.server.port}", "--model", profile.server.model_id,
            *(["--prompts", source] if source else ["--input-run", str(input_run)]),
            "--label", label, "--concurrency", ",".join(str(c) for c in b.concurrency),
            "--num-prompts", str(b.num_prompts),
            *(["--max-tokens", str(b.max_tokens)] if b.max_tokens is not None else []),
            "--temperature", f"{b.temperature:g}", "--seed", str(b.seed), "--client", b.client,
            "--ready-timeout", f"{profile.server.load_timeout_s:g}"]
    if profile.server.model_path != profile.server.model_id:
        argv += ["--tokenizer", profile.server.model_path]
    if (profile.drafter.trust_remote_code or "--trust-remote-code" in profile.server.vllm_args
            or "--trust-remote-code" in profile.server.command):
        argv.append("--trust-remote-code")
    if baseline_run:  # a contender: the figures a drafter is read against
        argv += ["--baseline-run", baseline_run]
        if b.reference_acceptance is not None and b.reference_k is not None:
            argv += ["--reference-acceptance", f"{b.reference_acceptance:g}", "--reference-k", str(b.reference_k)]
        if b.split_prompts:
            argv += ["--split-prompts", str(b.split_prompts)]
    if third_run:
        argv += ["--third-run", third_run]
    if api_key_path:
        argv += ["--api-key-file", api_key_path]
    if vllm_python and b.client != "ours":
        argv += ["--vllm-python", vllm_python]
    return argv
