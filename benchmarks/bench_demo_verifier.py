"""The demo's tiny verifier (sim/tinylm.py): how varied its answers are, and how fast the stand-in
generates with it, next to the previous recipe, side by side in one run.

    python benchmarks/bench_demo_verifier.py [--completions 300] [--rounds 3] [--json]

Both models answer their own demo dataset's prompts (console.demo.write_demo_dataset now, the few dozen
repeated questions before) at the demo profile's sampling settings (profiles/demo.toml: temperature,
top_p, max_tokens, thinking on), one request at a time through the stand-in's generation code
(sim.tinylm_text.TinyText.chat, which the stand-in serialises too), each request seeded with its index.

- Distinct-4-gram ratio: the completions' text (reasoning, a space, content) split on whitespace; the
  word 4-grams of every completion pooled; distinct 4-grams / all 4-grams. Target >= 0.5 for the current
  verifier (the previous one: about 0.04, a handful of stock sentences).
- Requests per second: the two models take turns (--rounds rounds, each model answering
  completions / rounds requests per round), so a busy machine slows both alike; each model's figure is
  its requests over its own summed time. Target: current / previous >= 1.

The previous recipe (version 4: a 1,024-token BPE and 240 steps on canned chat turns only) is kept here
and nowhere else; it is rebuilt bit for bit into its own cache directory on first use.

Acceptance (--records N, default 300; --no-acceptance skips it): the demo host is started in a temp dir,
`eagle3-console run pipeline --limit N` trains a drafter on N demo records with the project's own
stages (generate -> prepare -> extract -> train -> verify), and verify's table gives the mean accepted
length at k=3 on the held-out records next to an untrained draft's. Then the extract run is copied
with its training hidden states delayed by one position (row t gets the states of row t-1: misaligned
as a pipeline bug would leave them; the held-out states stay correct) and `run train` + `run verify`
train and measure a drafter on that copy. Targets: the correct drafter clearly above the untrained
one and clearly below the 4.0 ceiling (1.5 to 3.2), the shifted one clearly below the correct one.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim import textgen, tinycorpus, tinylm  # noqa: E402

# the recipe the demo used before issue 13, field for field
PREVIOUS = tinylm.Recipe(version=4, vocab_size=1024, hidden_size=64, intermediate_size=192, layers=4, heads=4,
                         kv_heads=2, max_positions=4096, canned=400, seed=1, steps=240, batch=8, block=128,
                         lr=8e-3, temperature=0.7, top_p=0.95)


def previous_turns(count: int = 400, seed: int = 1) -> list[tinycorpus.Turn]:
    """The previous corpus: canned reasoning and answers (textgen) for the canned questions only."""
    rng = random.Random(seed)
    qs = tinycorpus.canned_questions()
    out = []
    for i in range(count):
        q = qs[i % len(qs)]
        thinking = rng.random() >= 0.125
        reasoning, answer = textgen.generate(rng.getrandbits(64), q, thinking=thinking, quote_topic=False)
        out.append(tinycorpus.render_turn(q, reasoning.text, answer.text, system=rng.random() < 0.25,
                                          thinking=thinking))
    return out


def previous_prompts(count: int) -> list[str]:
    """The previous demo dataset: the canned asks cycled over the canned topics."""
    asks, topics = tinycorpus.DEMO_ASKS, tinycorpus.DEMO_TOPICS
    return [asks[i % len(asks)].format(t=topics[(i // len(asks)) % len(topics)]) for i in range(count)]


def previous_model() -> Path:
    turns = previous_turns()
    root = tinylm.cache_root().parent / "bench-previous-verifier"
    final = root / PREVIOUS.ident(tinycorpus.digest(turns))
    if not (final / "config.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            tinylm.build(PREVIOUS, turns, tmp)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def current_prompts(count: int) -> list[str]:
    from console.demo import write_demo_dataset

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo-prompts.jsonl"
        write_demo_dataset(path, rows=count)
        return [json.loads(line)["conversations"][0]["value"] for line in path.read_text().splitlines()]


def distinct_4(texts: list[str]) -> float:
    grams: set[tuple[str, ...]] = set()
    total = 0
    for text in texts:
        words = text.split()
        for i in range(len(words) - 3):
            grams.add(tuple(words[i:i + 4]))
            total += 1
    return len(grams) / total if total else 0.0


class Runner:
    """One model answering its prompts in order; keeps the texts, token counts and time spent."""

    def __init__(self, name: str, directory: Path, prompts: list[str], settings: dict):
        from sim.tinylm_text import TinyText

        self.name, self.prompts, self.settings = name, prompts, settings
        self.model = TinyText(directory)
        self.texts: list[str] = []
        self.tokens = 0
        self.unfinished = 0
        self.seconds = 0.0

    async def run(self, start: int, count: int) -> None:
        from sim.tinylm_text import Sampling

        s = self.settings
        began = time.perf_counter()
        for i in range(start, start + count):
            messages = [{"role": "user", "content": self.prompts[i]}]
            prompt = self.model.chat_prompt(messages, thinking=s["thinking"])
            out = await self.model.chat(messages, prompt, thinking=s["thinking"], max_tokens=s["max_tokens"],
                                        sampling=Sampling(s["temperature"], s["top_p"], None, i))
            self.texts.append((out.reasoning_text or "") + " " + (out.content_text or ""))
            self.tokens += len(out.ids)
            self.unfinished += out.finish_reason != "stop"
        self.seconds += time.perf_counter() - began


def demo_settings() -> dict:
    from console.profile import load_profile

    g = load_profile(ROOT / "console" / "demo.toml").generate
    return {"temperature": g.temperature, "top_p": g.top_p, "max_tokens": g.max_tokens,
            "thinking": bool(g.chat_template_kwargs.get("thinking", True))}


async def measure(args: argparse.Namespace) -> dict:
    settings = demo_settings()
    started = time.perf_counter()
    current_dir = tinylm.ensure_model()
    current_build = time.perf_counter() - started
    previous_dir = previous_model()
    current = Runner("current", current_dir, current_prompts(args.completions), settings)
    previous = Runner("previous", previous_dir, previous_prompts(args.completions), settings)
    per_round = -(-args.completions // args.rounds)
    for r in range(args.rounds):
        start = r * per_round
        count = min(per_round, args.completions - start)
        for runner in (previous, current) if r % 2 == 0 else (current, previous):
            await runner.run(start, count)
    recipe = json.loads((current_dir / "recipe.json").read_text())

    def figures(runner: Runner) -> dict:
        return {"distinct_4": round(distinct_4(runner.texts), 4), "requests": len(runner.texts),
                "requests_per_s": round(len(runner.texts) / runner.seconds, 3),
                "tokens_per_request": round(runner.tokens / len(runner.texts), 1),
                "unfinished": runner.unfinished, "model_dir": str(runner.model.model_dir)}

    return {"settings": settings, "current": figures(current), "previous": figures(previous),
            "rps_ratio": round((len(current.texts) / current.seconds) / (len(previous.texts) / previous.seconds), 3),
            "current_build_seconds": recipe.get("build_seconds"),
            "build_seconds_this_run": round(current_build, 1) if current_build > 1 else 0.0}


def cli(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def checked(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


def shifted_copy(runs: Path, source: str, target: str) -> None:
    """A completed extract run like `source` whose training hidden states are delayed by one position."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dst = runs / source, runs / target
    dst.mkdir()
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["run_id"] = target
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2))
    shutil.copy(src / "events.jsonl", dst / "events.jsonl")
    summary = json.loads((src / "summary.json").read_text())
    states = dst / "train_hidden_states"
    states.mkdir()
    for f in Path(summary["outputs"]["train_hidden_states"]).glob("hs_*.safetensors"):
        t = load_file(str(f))
        h = t["hidden_states"]
        t["hidden_states"] = torch.cat([h[:1], h[:-1]], dim=0).contiguous()
        save_file(t, str(states / f.name))
    summary.update(run_id=target, outputs={**summary["outputs"], "train_hidden_states": str(states)})
    (dst / "summary.json").write_text(json.dumps(summary, indent=2))


def acceptance(verify_dir: Path) -> dict:
    acc = json.loads((verify_dir / "verify.json").read_text())["acceptance"]
    return {"trained": acc["trained"]["mean_acceptance_length"], "untrained": acc["untrained"]["mean_acceptance_length"],
            "k": acc.get("k")}


def pipeline_acceptance(records: int) -> dict:
    """Mean accepted length at k=3 of drafters trained with the project's pipeline (see the docstring)."""
    with tempfile.TemporaryDirectory(prefix="e3-bench-verifier-") as tmp:
        work = Path(tmp) / "demo"
        profile = checked(cli("demo-host", "start", "--dir", str(work), "--speed", "10"), "demo-host start").stdout.strip()
        try:
            checked(cli("wait-ready", "--profile", profile, "--timeout", "300"), "wait-ready")
            began = time.perf_counter()
            checked(cli("run", "pipeline", "--profile", profile, "--limit", str(records), "--run-id", "good",
                        "--yes", "--wait"), "run pipeline")
            pipeline_s = time.perf_counter() - began
            runs = work / "runs"
            shifted_copy(runs, "good-extract", "shifted-extract")
            checked(cli("run", "train", "--profile", profile, "--input", "shifted-extract", "--run-id",
                        "shifted-train", "--wait"), "run train (shifted)")
            checked(cli("run", "verify", "--profile", profile, "--input", "shifted-train", "--run-id",
                        "shifted-verify", "--wait"), "run verify (shifted)")
            good, shifted = acceptance(runs / "good-verify"), acceptance(runs / "shifted-verify")
            heldout = json.loads((runs / "good-extract" / "summary.json").read_text())["rows"]
            return {"records": records, "heldout_rows": heldout.get("heldout"), "k": good["k"],
                    "trained": good["trained"], "untrained": good["untrained"], "shifted": shifted["trained"],
                    "pipeline_seconds": round(pipeline_s, 1)}
        finally:
            cli("demo-host", "stop", "--dir", str(work))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--completions", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of the two models")
    p.add_argument("--records", type=int, default=300, help="demo records the pipeline trains the drafter on")
    p.add_argument("--no-acceptance", action="store_true", help="only diversity and speed (no pipeline run)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args()
    if args.completions < 1 or args.rounds < 1:
        p.error("--completions and --rounds must be >= 1")
    tinylm.check_available()
    res = asyncio.run(measure(args))
    if not args.no_acceptance:
        res["acceptance"] = pipeline_acceptance(args.records)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    cur, prev, s = res["current"], res["previous"], res["settings"]
    print(f"demo verifier {cur['model_dir']} (built in {res['current_build_seconds']} s)")
    print(f"settings: temperature {s['temperature']}, top_p {s['top_p']}, max_tokens {s['max_tokens']}, "
          f"thinking {s['thinking']}; {cur['requests']} completions each")
    print(f"distinct-4-gram ratio: current {cur['distinct_4']:.3f} (target >= 0.5), previous {prev['distinct_4']:.3f}")
    print(f"requests/s: current {cur['requests_per_s']:.2f}, previous {prev['requests_per_s']:.2f}, "
          f"ratio {res['rps_ratio']:.2f} (target >= 1.0)")
    print(f"tokens/request: current {cur['tokens_per_request']}, previous {prev['tokens_per_request']}; "
          f"unfinished at max_tokens: current {cur['unfinished']}, previous {prev['unfinished']}")
    if "acceptance" in res:
        a = res["acceptance"]
        print(f"mean accepted length at k={a['k']} on {a['heldout_rows']} held-out records, drafters trained by the "
              f"pipeline on {a['records']} demo records ({a['pipeline_seconds']} s):")
        print(f"  trained {a['trained']:.3f} (target 1.5 to 3.2), untrained {a['untrained']:.3f}, "
              f"shifted hidden states {a['shifted']:.3f} (target: clearly below trained)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
