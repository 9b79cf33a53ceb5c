"""The stage table: every stage the console shows, starts and follows, one row each, in pipeline order.

As console/ui/keys.py is for keys, this is for stages: the stages pane, `eagle3-console run`, the busy
rules, the server-swap confirmation and the pipeline plan all read it, so adding a stage is one row and
its argv builder. A row says:
- `name`: the stage name its events and its unit carry; `cli`: its name on `eagle3-console run` (None:
  not started by `run`); `label`: the stages pane's;
- `kind`: "server" (a server the console drives itself: no run of its own), "run" (one host program),
  "chain" (a pipeline run of the `in_pipeline` rows, in table order);
- the host's facts of a stage, from its row in the host's stage table (backend/contract/stages.py, by
  `name`; a console-only row has none): `input_stage`, `online_input`, `skip_online`, `in_pipeline`,
  `takes_gpus` ("always" / "online" / "no": starting it takes the GPUs from the baseline server: it stops
  it, the operator confirms first), `gpu_user` (it computes on the GPUs itself, so no server swap runs
  beside it);
- `build`: its argv builder, `async (ctx, run_id, input_run, req) -> (argv, preflight argv or None)`, with
  `ctx` the launcher (control/launch.py: the host, the profile, uploads and questions to the host);
- `beside_chain`: it shares nothing with a pipeline run (a download) and may run beside one;
- `view`: its typed progress view (console/telemetry/progress.py); `results`: what a finished run prints.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal, Protocol, Sequence

from backend.bench import PAIR_STAGE
from backend.bench.compare import CompareError, comparison_from_dict, format_table
from backend.contract import stages as host_stages
from backend.contract.stages import FETCH_DRAFTER
from backend.verify.report import online_lines, table as verify_table
from console.control import stage_argv
from console.parsers.text import clean_block
from console.telemetry import progress as views
from console.telemetry.bench_view import best_k_of, counted_for, finish_summary, gap_of, summary_notes
from console.telemetry.progress import StageProgress
from console.profile import Profile
from console.snapshot import RunInfo

Argv = list[str]


class Launcher(Protocol):
    """What an argv builder may ask for (console/control/launch.py's Launcher is the one)."""
    profile: Profile
    secrets: list[str]  # the secret files uploaded for this start so far (backend/kit/secret_files.py)

    async def dataset(self, given: str | None) -> str: ...
    async def api_key(self, run_id: str) -> str | None: ...
    async def hub_token(self) -> str | None: ...
    async def swap_plan(self, run_id: str) -> tuple[str, list[int]]: ...
    async def bench_pair(self, run_id: str, req: Any) -> Argv: ...
    async def served_context(self) -> int | None: ...
    async def pipeline_plan(self, chain_id: str, req: Any) -> str: ...


StageRequest = Any  # console/control/launch.py's StageRequest: the stage asked for and its options
Builder = Callable[[Launcher, str, "str | None", StageRequest], Awaitable[tuple[Argv, "Argv | None"]]]
View = Callable[[RunInfo, Sequence[RunInfo]], StageProgress]


def outputs(view: StageProgress, runs: Sequence[RunInfo]) -> list[str]:
    """A finished run's outputs for the next stage (the default result reader)."""
    return [f"{name}: {path}" for name, path in view.outputs]


@dataclass(frozen=True)
class Stage:
    name: str
    label: str
    kind: Literal["server", "run", "chain"] = "run"
    run_stage: str | None = None  # the stage its program's runs carry, when not `name` (the bench pair's)
    cli: str | None = None
    build: Builder | None = None
    beside_chain: bool = False
    view: View = views.counted("items")
    results: Callable[[StageProgress, Sequence[RunInfo]], list[str]] = outputs

    @property
    def runs_stage(self) -> str:
        """The stage its runs' events and run directories carry."""
        return self.run_stage or self.name

    @property
    def host(self) -> host_stages.HostStage:
        """The host's facts of this stage: its host row, or none of them (a server, the pipeline)."""
        return host_stages.find(self.name) or host_stages.HostStage(self.name)

    @property
    def input_stage(self) -> str | None:
        return self.host.input_stage

    @property
    def online_input(self) -> str | None:
        return self.host.online_input

    @property
    def skip_online(self) -> bool:
        return self.host.skip_online

    @property
    def in_pipeline(self) -> bool:
        return self.host.in_pipeline

    @property
    def takes_gpus(self) -> Literal["no", "always", "online"]:
        return self.host.takes_gpus

    @property
    def gpu_user(self) -> bool:
        return self.host.gpu_user

    def progress(self, run: RunInfo, runs: Sequence[RunInfo] = ()) -> StageProgress:
        return self.view(run, runs)


# -- argv builders: one per startable stage ------------------------------------------------------------

async def _generate(ctx: Launcher, run_id: str, input_run: str | None, req: StageRequest):
    p, dataset, key = ctx.profile, await ctx.dataset(req.dataset), await ctx.api_key(run_id)
    args = dict(dataset=dataset, limit=req.limit, fresh=req.fresh, api_key_path=key)
    return stage_argv.generate_argv(p, run_id, **args), stage_argv.generate_argv(p, run_id, preflight_only=True, **args)


async def _prepare(ctx: Launcher, run_id: str, input_run: str | None, req: StageRequest):
    return stage_argv.prepare_argv(ctx.profile, run_id, input_run or "", fresh=req.fresh), None


async def _extract(ctx: Launcher, run_id: str, input_run: str | None, req: StageRequest):
    plan_file, ids = await ctx.swap_plan(run_id)
    args = dict(plan_file=plan_file, aux_layer_ids=ids, fresh=req.fresh)
    return (stage_argv.extract_argv(ctx.profile, run_id, input_run or "", **args),
            stage_argv.extract_argv(ctx.profile, run_id, input_run or "", preflight_only=True, **args))


async def _train(ctx: Launcher, run_id: str, input_run: str | None, req: StageRequest):
    # online: the extraction server takes the baseline's place for the stage (backend/kit/swap.py)
    plan_file = (await ctx.swap_plan(run_id))[0] if req.is_online(ctx.profile) else None
    args = dict(fresh=req.fresh, plan_file=plan_file)
    return (stage_argv.train_argv(ctx.profile, run_id, input_run, **args),
            stage_argv.train_argv(ctx.profile, run_id, input_run, preflight_only=True, **args))


async def _verify(ctx: Launcher, run_id: str, input_run: str | None, req: StageRequest):
    if req.checkpoint is not None:
        stage_argv.check_host_path(req.checkpoint, "--checkpoint")
    plan_file = (await ctx.swap_plan(run_id))[0] if req.is_online(ctx.profile) else None
    return stage_argv.verify_argv(ctx.profile, run_id, input_run, fresh=req.fresh, plan_file=plan_file,
                                  checkpoint=req.checkpoint, served_context=await ctx.served_context()), None


async def _fetch_drafter(ctx: Launcher, run_id: str, input_run: str | None, req: StageRequest):
    token = await ctx.hub_token()
    return stage_argv.fetch_drafter_argv(ctx.profile, run_id, token_path=token, fresh=req.fresh), None


async def _bench(ctx: Launcher, run_id: str, input_run: str | None, req: StageRequest):
    return await ctx.bench_pair(run_id, req), None


async def _pipeline(ctx: Launcher, run_id: str, input_run: str | None, req: StageRequest):
    plan_file = await ctx.pipeline_plan(run_id, req)
    # the chain removes its stages' secrets at its end: a stage it skips or never reaches never reads them
    return stage_argv.chain_argv(ctx.profile, run_id, plan_file, fresh=req.fresh, secret_files=ctx.secrets), None


# -- result readers ------------------------------------------------------------------------------------

def _verify_table(view: StageProgress, runs: Sequence[RunInfo]) -> list[str]:
    """verify's table; when its report carries no count of vLLM's and the run book has a bench of the same
    checkpoint, that bench's count beside the prediction."""
    report = getattr(view, "report", None)
    if report is not None:
        try:
            table = [clean_block(verify_table(dict(report)))]
        except (KeyError, TypeError, ValueError, IndexError):
            return outputs(view, runs)  # an unexpected report: its outputs are still worth printing
        run = next((r for r in runs if r.run_id == view.run_id), None)
        found = counted_for(run, runs) if run is not None and not online_lines(dict(report)) else None
        return table + ([clean_block("\n".join(found[1].lines(view.run_id, found[0])))] if found else [])
    return outputs(view, runs)


def _chain_results(view: StageProgress, runs: Sequence[RunInfo]) -> list[str]:
    """A pipeline run that verified ends with verify's table."""
    verify_run = view.stage_run("verify") if isinstance(view, views.ChainProgress) else None
    found = next((r for r in runs if r.run_id == verify_run and r.state == "done"), None)
    verified = views.verify_view(found) if found is not None else None
    return _verify_table(verified, runs) if verified is not None and verified.report is not None \
        else outputs(view, runs)


def _bench_table(view: StageProgress, runs: Sequence[RunInfo]) -> list[str]:
    """The comparison's table, and with several K the best of them."""
    run = next((r for r in runs if r.run_id == view.run_id), None)
    summary = finish_summary(run.last_event) if run is not None else {}
    if isinstance(summary.get("comparison"), dict):
        try:
            table = [clean_block(format_table(comparison_from_dict(summary["comparison"])))]
        except (CompareError, TypeError, ValueError):
            return outputs(view, runs)
        best = best_k_of(summary)
        gap = gap_of(summary, runs)
        return (table + ([clean_block(best.line())] if best is not None else [])
                + ([clean_block("\n".join(gap[1].lines(gap[0], view.run_id)))] if gap is not None else [])
                + [clean_block(note) for note in summary_notes(summary)])
    return outputs(view, runs)


# -- the table -----------------------------------------------------------------------------------------

TABLE: tuple[Stage, ...] = (
    Stage("serve", "serve", kind="server"),
    Stage("generate", "generate", cli="generate", build=_generate, view=views.generation_view),
    Stage("prepare", "prepare", cli="prepare", build=_prepare, view=views.counted("rows")),
    Stage("extract", "extract", cli="extract", build=_extract, view=views.counted("samples")),
    Stage("train", "train", cli="train", build=_train, view=views.train_view),
    Stage("verify", "verify", cli="verify", build=_verify, view=views.verify_view, results=_verify_table),
    Stage("serve_drafter", "serve+drafter", kind="server"),
    Stage(FETCH_DRAFTER, "fetch drafter", cli="fetch-drafter", build=_fetch_drafter, beside_chain=True,
          view=views.bytes_view),
    Stage("bench", "bench", run_stage=PAIR_STAGE, cli="bench", build=_bench, view=views.pair_view,
          results=_bench_table),
    Stage("pipeline", "pipeline", kind="chain", cli="pipeline", build=_pipeline, view=views.chain_view,
          results=_chain_results),
)


class UnknownStage(KeyError):
    pass


def table() -> tuple[Stage, ...]:
    return TABLE


def names() -> tuple[str, ...]:
    return tuple(s.name for s in TABLE)


def get(name: str) -> Stage:
    for s in TABLE:
        if s.name == name:
            return s
    raise UnknownStage(name)


def by_cli(cli: str) -> Stage:
    for s in TABLE:
        if s.cli == cli:
            return s
    raise UnknownStage(cli)


def of_run(run_stage: str) -> Stage:
    """The row whose program writes runs of `run_stage` (else the row of that name: the pair's benches
    are shown as benches)."""
    for s in TABLE:
        if s.runs_stage == run_stage:
            return s
    return get(run_stage)


def view_of(run: RunInfo, runs: Sequence[RunInfo] = ()) -> StageProgress:
    """A run's typed progress, by its stage's row (a stage this console does not know: plain counts)."""
    try:
        return of_run(run.stage).progress(run, runs)
    except UnknownStage:
        return views.counted("items")(run, runs)


def starts_pair(name: str) -> bool:
    """Whether the row `name` starts the bench pair (backend/benchpair.py: its K values, its drafter loads)."""
    try:
        return get(name).runs_stage == PAIR_STAGE
    except UnknownStage:
        return False


def runs_of(name: str, runs: Sequence[RunInfo]) -> list[RunInfo]:
    """The runs the row `name` started (by the stage their events carry)."""
    stage = get(name).runs_stage
    return [r for r in runs if r.stage == stage]


def pick_run(runs: Sequence[RunInfo], name: str) -> RunInfo | None:
    """The row's running run if any, else the last one listed (the newest)."""
    mine = runs_of(name, runs)
    running = [r for r in mine if r.state == "running"]
    return running[-1] if running else mine[-1] if mine else None


def cli_names() -> tuple[str, ...]:
    return tuple(s.cli for s in TABLE if s.cli)


def pipeline_stages() -> tuple[str, ...]:
    """The host stages a pipeline run chains, in order."""
    return tuple(s.name for s in TABLE if s.in_pipeline)


def chain_stage() -> str:
    return next(s.name for s in TABLE if s.kind == "chain")


def swap_exclusive() -> tuple[str, ...]:
    """The runs a server swap never starts beside: the other swaps, the stages computing on the GPUs
    (the swapped-in server would take them) and a pipeline run (it may do either)."""
    return tuple(s.name for s in TABLE if s.takes_gpus != "no" or s.gpu_user or s.kind == "chain")


# the stage names in display order, as the table stands at import (read names() where a test may add a row)
STAGES: tuple[str, ...] = names()
