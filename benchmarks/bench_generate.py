"""Client-side cost of the generate stage: CPU per completion and peak RSS, against a zero-latency
stand-in, next to a bare aiohttp client doing the same requests (the peer baseline).

    python benchmarks/bench_generate.py [--samples 20000] [--concurrency 200] [--response-tokens 8192]
                                        [--token-ids] [--peer] [--repeat N]

Every client runs as its own process; its CPU (user + sys) and peak RSS come from wait4's rusage of
that process alone, never the server's. A zero-sample run of each gives its fixed start-up cost, which
is subtracted to get the per-completion figure. Targets: <= 0.5 ms CPU per completion, peak RSS <= 300
MB and flat (sampled over the run with psutil).

`--peer` also runs `speculators regenerate-responses` (the aiohttp-based peer) against the same
stand-in, side by side. It always asks for token ids (and decodes them into its `text` column with
the model's tokenizer), so compare it with `--token-ids`; the stand-in is then served under the path
of a small word-level tokenizer built here, which the peer loads as its "model".
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "bench-model"

BARE_CLIENT = r'''
import asyncio, json, sys, aiohttp
url, n, conc, max_tokens, ids, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6]
async def main():
    queue = asyncio.Queue(maxsize=2 * conc)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as session:
        async def work():
            while (i := await queue.get()) is not None:
                body = {"model": model, "max_tokens": max_tokens,
                        "messages": [{"role": "user", "content": f"Question {i}: explain topic {i}."}]}
                if ids:
                    body["return_token_ids"] = True
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    data = json.loads(await resp.read())
                    assert data["choices"][0]["message"]["content"]
        workers = [asyncio.create_task(work()) for _ in range(conc)]
        for i in range(n):
            await queue.put(i)
        for _ in workers:
            await queue.put(None)
        await asyncio.gather(*workers)
asyncio.run(main())
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the stand-in exited while starting")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the stand-in did not become ready")


def run_reaping_ourselves(argv: list[str], sample_rss: bool) -> dict[str, float]:
    # Popen.poll() would reap the child and lose its rusage: watch /proc instead, then wait4 it.
    import psutil

    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    samples: list[float] = []
    while True:
        try:
            if ps.status() == psutil.STATUS_ZOMBIE:
                break
            if sample_rss:
                samples.append(ps.memory_info().rss / 2**20)
        except psutil.Error:
            break
        time.sleep(0.25)
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} exited {proc.returncode}: {err[-2000:]}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024,
            "wall_s": time.monotonic() - start, "rss_samples": samples}


def canned_text_args() -> list[str]:
    """Zero-cost canned text from the stand-in, where it can also run a real tiny model instead."""
    config = (ROOT / "sim" / "config.py").read_text()
    return ["--text-backend", "canned"] if "--text-backend" in config else []


def build_tokenizer(directory: Path) -> None:
    """A word-level tokenizer over the stand-in's vocabulary, for the peer's detokenizer (no download)."""
    from tokenizers import Tokenizer, models

    from sim.textgen import VOCAB_SIZE

    vocab = {f"w{i}": i for i in range(VOCAB_SIZE)}
    directory.mkdir(parents=True, exist_ok=True)
    Tokenizer(models.WordLevel(vocab, unk_token="w0")).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "w0", "model_max_length": 1 << 20}))


def peer_argv(url: str, model: str, dataset: Path, out: Path, limit: int, args: argparse.Namespace) -> list[str]:
    speculators = Path(sys.executable).with_name("speculators")
    return [str(speculators), "regenerate-responses", "--endpoint", url + "/v1/chat/completions",
            "--model", model, "--dataset", str(dataset), "--limit", str(limit), "--concurrency",
            str(args.concurrency), "--max-tokens", str(args.response_tokens), "--outfile", str(out)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--response-tokens", type=int, default=8192)
    p.add_argument("--token-ids", action="store_true", help="also ask for token ids (~2.4x bigger bodies)")
    p.add_argument("--peer", action="store_true", help="also run speculators regenerate-responses")
    p.add_argument("--repeat", type=int, default=1, help="runs of each client, alternated; medians are reported")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args()
    if args.peer and not args.token_ids:
        print("note: the peer always asks for token ids; add --token-ids for a like-for-like comparison",
              file=sys.stderr)

    tmp = Path(tempfile.mkdtemp(prefix="bench-generate-"))
    model = MODEL
    if args.peer:
        model = str(tmp / "tokenizer")
        build_tokenizer(Path(model))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "sim.vllm_server", "--host", "127.0.0.1",
                               "--port", str(port), "--model", "/models/bench", "--served-model-name", model,
                               "--load-seconds", "0", "--latency", "0", "--max-num-seqs", "1024",
                               "--response-tokens", str(args.response_tokens), *canned_text_args()],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, server)
        dataset = tmp / "prompts.jsonl"
        with open(dataset, "w") as f:
            for i in range(args.samples):
                f.write(json.dumps({"conversations": [{"from": "human", "value": f"Question {i}: explain "
                                                       f"topic {i}."}]}) + "\n")
        with urllib.request.urlopen(urllib.request.Request(
                url + "/v1/chat/completions", method="POST", headers={"Content-Type": "application/json"},
                data=json.dumps({"model": model, "max_tokens": args.response_tokens,
                                 "return_token_ids": args.token_ids,
                                 "messages": [{"role": "user", "content": "size probe"}]}).encode())) as r:
            body_bytes = len(r.read())

        def stage(limit: int, run_id: str) -> list[str]:
            return [sys.executable, "-m", "backend.generate", "--dataset", str(dataset), "--work-dir",
                    str(tmp / "work"), "--run-id", run_id, "--endpoint", url, "--model", model,
                    "--max-tokens", str(args.response_tokens), "--concurrency", str(args.concurrency),
                    "--return-token-ids", "on" if args.token_ids else "off", "--no-token-rows",
                    "--skip-preflight", "--limit", str(limit), "--progress-interval", "5"]

        startup = run_reaping_ourselves(stage(0, "startup"), sample_rss=False)
        bare_startup = run_reaping_ourselves([sys.executable, "-c", BARE_CLIENT, url, "0", "1", "1", "0", model],
                                             sample_rss=False)
        peer_startup = None
        if args.peer:
            peer_startup = run_reaping_ourselves(peer_argv(url, model, dataset, tmp / "peer0.jsonl", 0, args),
                                                 sample_rss=False)
        # Alternate the clients so a neighbour's load on this shared machine hits them alike; medians below.
        ours_runs, bare_runs, peer_runs = [], [], []
        for k in range(args.repeat):
            ours_runs.append(run_reaping_ourselves(stage(args.samples, f"bench{k}"), sample_rss=True))
            bare_runs.append(run_reaping_ourselves([sys.executable, "-c", BARE_CLIENT, url, str(args.samples),
                                                    str(args.concurrency), str(args.response_tokens),
                                                    "1" if args.token_ids else "0", model], sample_rss=True))
            if args.peer:
                peer_runs.append(run_reaping_ourselves(
                    peer_argv(url, model, dataset, tmp / f"peer{k + 1}.jsonl", args.samples, args), sample_rss=True))
        out_bytes = (tmp / "work" / "runs" / "bench0" / "output.jsonl").stat().st_size
        peer_bytes = (tmp / "peer1.jsonl").stat().st_size if args.peer else 0
    finally:
        server.kill()
        server.wait()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)

    n = args.samples

    def per_completion(runs: list[dict], start: dict) -> list[float]:
        return [round(1000 * (r["cpu_s"] - start["cpu_s"]) / n, 3) for r in runs]

    ours_all, bare_all = per_completion(ours_runs, startup), per_completion(bare_runs, bare_startup)
    ours_ms, bare_ms = round(statistics.median(ours_all), 3), round(statistics.median(bare_all), 3)
    ours_peak = max(r["peak_rss_mb"] for r in ours_runs)
    rss = max((r["rss_samples"] for r in ours_runs), key=len) or [0.0]
    quarters = [rss[min(len(rss) - 1, int(q * len(rss)))] for q in (0.25, 0.5, 0.75)] + [rss[-1]]
    figures = {
        "samples": n, "concurrency": args.concurrency, "response_bytes": body_bytes,
        "token_ids": args.token_ids, "output_bytes_per_record": round(out_bytes / n), "repeat": args.repeat,
        "stage_cpu_ms_per_completion": ours_ms, "bare_aiohttp_cpu_ms_per_completion": bare_ms,
        "stage_cpu_ms_runs": ours_all, "bare_cpu_ms_runs": bare_all,
        "ratio_stage_to_bare": round(ours_ms / bare_ms, 2) if bare_ms > 0 else None,
        "stage_startup_cpu_s": round(startup["cpu_s"], 3), "stage_peak_rss_mb": round(ours_peak, 1),
        "stage_rss_mb_at_25_50_75_100pct": [round(x, 1) for x in quarters],
        "bare_peak_rss_mb": round(max(r["peak_rss_mb"] for r in bare_runs), 1),
        "stage_wall_s": round(statistics.median(r["wall_s"] for r in ours_runs), 2),
        "bare_wall_s": round(statistics.median(r["wall_s"] for r in bare_runs), 2),
        "targets": {"cpu_ms_per_completion": 0.5, "peak_rss_mb": 300},
    }
    if peer_runs and peer_startup is not None:
        peer_all = per_completion(peer_runs, peer_startup)
        peer_ms = round(statistics.median(peer_all), 3)
        figures.update({"peer_regenerate_responses_cpu_ms_per_completion": peer_ms, "peer_cpu_ms_runs": peer_all,
                        "ratio_stage_to_peer": round(ours_ms / peer_ms, 2) if peer_ms > 0 else None,
                        "peer_startup_cpu_s": round(peer_startup["cpu_s"], 3),
                        "peer_peak_rss_mb": round(max(r["peak_rss_mb"] for r in peer_runs), 1),
                        "peer_wall_s": round(statistics.median(r["wall_s"] for r in peer_runs), 2),
                        "peer_output_bytes_per_record": round(peer_bytes / n)})
    figures["meets_targets"] = ours_ms <= 0.5 and ours_peak <= 300
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:40s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
