"""The plan and command line of a bench of the baseline against the drafter server as one detached host
program (backend/benchpair.py): the baseline's bench, the contenders' in the order they are benched (our
drafter at [drafter].num_speculative_tokens, or at each of several K; a published drafter first when the
profile names one), and the one server switch's plan (switch_plan.py: the baseline home, a drafter server
per contender, all in the drafter server's unit, away), built here from the profile. Pure functions, no I/O.
"""
from __future__ import annotations

from typing import Any, Sequence

from console.control import drafter_server as ds
from console.control.bench_stage import bench_argv
from console.control.stage_argv import secret_file_args
from console.control.switch_plan import derived_server, switch_plan
from console.control.units import ServerProgram, profile_program
from console.parsers.vllm_cmdline import server_python
from console.profile import Profile, check_k_values


def pair_run_ids(run_id: str) -> tuple[str, str, str]:
    """The bench runs of one pair: (the baseline's, the drafter server's, the published drafter's)."""
    return f"{run_id}-baseline", f"{run_id}-drafter", f"{run_id}-third"


def k_run_id(run_id: str, k: int) -> str:
    """The bench run of our drafter at K = `k`, when a pair benches several K."""
    return f"{run_id}-k{k}"


def check_against_trained(k_values: Sequence[int], trained_k: int | None, checkpoint: str, where: str) -> None:
    """K values past the K the drafter was trained for measure positions it never learnt: refused (vLLM
    itself would serve them). ValueError naming `where` (the flag or the profile key) and the bound."""
    problem = check_k_values(list(k_values))
    if problem:
        raise ValueError(f"{where} {list(k_values)}: expected {problem}")
    over = [k for k in k_values if trained_k is not None and k > trained_k]
    if over:
        raise ValueError(f"{where} {list(k_values)}: the drafter {checkpoint} was trained for K={trained_k} "
                         f"(its config.json: speculators_config.proposal_methods[0].speculative_tokens); "
                         f"bench K values 1..{trained_k}, not {', '.join(map(str, over))}")


def drafter_loads(profile: Profile, k_values: Sequence[int] = ()) -> int:
    """How many drafter server starts a bench pair costs: one per K (one: the profile's K), one more for
    a published drafter."""
    return max(1, len(k_values)) + (1 if profile.bench.third_drafter else 0)


def drafter_starts_text(profile: Profile, k_values: Sequence[int] = ()) -> str:
    """What the drafter server starts of a bench pair are, for its confirmation: `3 drafter server starts
    (K=2, K=3, K=4)`."""
    what = [f"K={k}" for k in k_values] or [f"K={profile.drafter.num_speculative_tokens}"]
    if profile.bench.third_drafter:
        what.append("the published drafter")
    n = drafter_loads(profile, k_values)
    return f"{n} drafter server start{'s' if n != 1 else ''} ({', '.join(what)})"


def pair_plan(profile: Profile, run_id: str, checkpoint: str, *, input_run: str | None = None,
              api_key_path: str | None = None, no_expand_option: bool = False,
              third_checkpoint: str | None = None, program: ServerProgram | None = None,
              k_values: Sequence[int] = ()) -> dict[str, Any]:
    """The plan backend/benchpair.py runs (raises DrafterServerError / ValueError with what to fix).
    `third_checkpoint`: a published drafter ([bench].third_drafter, fetched and verified), benched too.
    `program`: the baseline's (operator_unit.read_server_program), which the drafter servers start from.
    `k_values`: bench our drafter at each of these K (run ids R-k2, R-k3, ...); empty: once, at the
    profile's K (run id R-drafter)."""
    problem = check_k_values(list(k_values))
    if problem:
        raise ValueError(f"K values {list(k_values)}: expected {problem}")
    base_id, drafter_id, third_id = pair_run_ids(run_id)
    # every bench runs `vllm bench serve` through the baseline's vLLM (the drafter servers start from it)
    common = {"input_run": input_run, "api_key_path": api_key_path,
              "vllm_python": server_python((program or profile_program(profile)).argv)}
    drafter_stop = ds.drafter_stop_command(profile).argv
    unit = ds.drafter_unit(profile)
    third_run = third_id if third_checkpoint else None

    def contender(server: str, bench_id: str, label: str, title: str, ckpt: str, k: int | None, ours: bool):
        start = ds.drafter_start_command(profile, ckpt, no_expand_option=no_expand_option, program=program, k=k).argv
        spec = derived_server(profile, server, unit, start, drafter_stop, ds.drafter_command(profile, ckpt, program, k=k))
        argv = bench_argv(profile, bench_id, label=label, baseline_run=base_id,
                          third_run=third_run if ours else None, **common)
        return spec, {"server": server, "run_id": bench_id, "argv": argv, "title": title,
                      "k": k or profile.drafter.num_speculative_tokens, "ours": ours}

    made = [contender("third", third_id, "published", "published drafter", third_checkpoint, None, False)] \
        if third_checkpoint else []
    if k_values:
        made += [contender(f"drafter_k{k}", k_run_id(run_id, k), f"drafter-k{k}", f"drafter (K={k})", checkpoint, k,
                           True) for k in k_values]
    else:
        made.append(contender("drafter", drafter_id, "drafter", "drafter", checkpoint, None, True))
    return {
        "checkpoint": checkpoint,
        **({"third_checkpoint": third_checkpoint} if third_checkpoint else {}),
        "baseline": {"server": "baseline", "run_id": base_id,
                     "argv": bench_argv(profile, base_id, label="baseline", **common)},
        "contenders": [bench for _, bench in made],
        "switch": switch_plan(profile, [spec for spec, _ in made]).to_dict(),
    }


def pair_argv(profile: Profile, run_id: str, plan_file: str, *, fresh: bool = False,
              secret_files: Sequence[str] = ()) -> list[str]:
    """`secret_files`: the API key's copy every bench of the pair reads; the pair removes it at its end."""
    argv = [profile.paths.python, "-m", "backend.benchpair", "--work-dir", profile.paths.work_dir,
            "--run-id", run_id, "--plan", plan_file, *secret_file_args(secret_files)]
    return argv + (["--fresh"] if fresh else [])
