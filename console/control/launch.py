"""Launch, stop and find stage programs on the host.

A stage is `<host python> -m backend.<stage> ...` started detached (systemd-run or tmux, see control/units.py),
so losing the console or SSH never kills it. The backend code is uploaded first, addressed by a hash of
its content: a host whose copy is older gets the new one, a host that has it already gets nothing.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import posixpath
import shlex
import tarfile
import time
import weakref
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable

from console.profile import Profile, api_key, hub_token
from console.host.base import Host
from console.parsers.text import clean_block
from backend.runs import RunDirError
from backend.runs import check_run_id as _check_run_id
from backend.events import UNIT_ENV
from backend.chain.plan import PlannedStage, chain_stage_run_id, dumps_plan
from backend.pipeline import INPUT_STAGE
from backend.pipeline import STAGES as PIPELINE_STAGES
from console.control import stage_argv
from console.control import drafter_server as ds
from console.control.bench_pair import pair_argv, pair_plan
from console.control.stages import FETCH_DRAFTER
from console.control.extraction import ExtractionPlanError, build_plan, describe_plan, plan_path
from console.control.operator_unit import OperatorUnitError, read_server_program
from console.control.units import (UnitNameError, exit_status_path, stage_log_path, stage_start_command,
                                   stage_stop_command, stage_unit_name, tmux_target)

# The upload is the installed `backend` package and nothing else: host code only, never the console or the
# demo's stand-in, and the same files whether the console runs from a wheel or a checkout.
BACKEND_PACKAGE = "backend"
EXTRACT_STOP_S = 180.0  # beyond the servers' own stop times, for a stage stopping with a server swap


class StageError(Exception):
    """A stage cannot be started; the message says why and what to do."""


@dataclass
class Launch:
    run_id: str
    unit: str
    run_dir: str
    commands: list[str]


def check_run_id(run_id: str) -> str:
    try:
        return _check_run_id(run_id)
    except RunDirError as e:
        raise StageError(str(e)) from None


def new_run_id(stage: str) -> str:
    return f"{stage}-{time.strftime('%Y%m%d-%H%M%S')}"


def backend_files() -> list[tuple[str, bytes]]:
    """(path in the bundle, content) of every .py file of the installed backend package, sorted."""
    found: list[tuple[tuple[str, ...], bytes]] = []

    def walk(node: Traversable, parts: tuple[str, ...]) -> None:
        for child in node.iterdir():
            if child.is_dir():
                if child.name != "__pycache__":
                    walk(child, (*parts, child.name))
            elif child.name.endswith(".py"):
                found.append(((*parts, child.name), child.read_bytes()))

    walk(files(BACKEND_PACKAGE), (BACKEND_PACKAGE,))
    return [("/".join(parts), data) for parts, data in sorted(found)]


def backend_bundle() -> tuple[str, bytes]:
    """A deterministic tar.gz of the backend package's .py files, and a hash of exactly what it holds."""
    members = backend_files()
    digest = hashlib.sha256()
    for name, data in members:
        digest.update(name.encode() + b"\0" + data + b"\0")
    buf = io.BytesIO()
    # mtime=0: gzip's own header would otherwise stamp the time and make equal bundles differ
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w") as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    return digest.hexdigest()[:16], buf.getvalue()


# The work dir and the folders whose files the stages execute or obey: anyone who can write in one of them
# can replace the code a stage runs, the plan a swap follows, or a run's events.
TRUSTED_DIRS = ("", "code", "plans", "runs")


def work_dir_problem(text: str) -> str | None:
    """What is wrong with the work dir's folders from `id -u; id -g; stat -L -c '%u %g %a %n' DIRS` (pure):
    a folder that others can write (a group write bit only for a group other than the user's own), or
    that belongs to another user than this one or root. None when all are sound."""
    lines = text.splitlines()
    if len(lines) < 3 or not lines[0].strip().isdigit() or not lines[1].strip().isdigit():
        return f"cannot tell who owns the work dir (unexpected answer: {clean_block(text)[:200]!r})"
    uid, gid = lines[0].strip(), lines[1].strip()
    for line in lines[2:]:
        bits = line.split(" ", 3)
        if len(bits) != 4 or not all(b.isdigit() for b in bits[:2]):
            return f"cannot tell who owns the work dir (unexpected answer: {clean_block(line)[:200]!r})"
        owner, group, mode_text, path = bits
        try:
            mode = int(mode_text, 8)
        except ValueError:
            return f"cannot read the mode of {path!r}"
        writers = []
        if mode & 0o002:
            writers.append("every user")
        if mode & 0o020 and group != gid:
            writers.append(f"group {group}")
        if owner not in (uid, "0"):
            writers.append(f"its owner, user {owner}")
        if writers:
            return (f"{path} can be written by {' and '.join(writers)} (mode {mode_text}): whoever writes there "
                    f"can replace the code the stages run or the plans they follow; make it yours and "
                    f"`chmod go-w` it (work dir, code/, plans/, runs/)")
    return None


async def check_work_dir(host: Host, profile: Profile) -> None:
    """Create the work dir's trusted folders if needed, and refuse them when others can write there."""
    dirs = [posixpath.join(profile.paths.work_dir, d) if d else profile.paths.work_dir for d in TRUSTED_DIRS]
    script = 'mkdir -p -- "$@" && id -u && id -g && stat -L -c "%u %g %a %n" -- "$@"'
    res = await host.run(["sh", "-c", script, "sh", *dirs], timeout=30)
    if not res.ok:
        raise StageError(f"the work dir {profile.paths.work_dir} is not usable: "
                         f"{clean_block((res.stderr or res.stdout).strip())[:300]}")
    problem = work_dir_problem(res.stdout)
    if problem:
        raise StageError(f"refusing the work dir: {problem}")


async def ensure_backend(host: Host, profile: Profile, shown: list[str]) -> str:
    """Make sure the host has this backend; return the directory to put on PYTHONPATH. The work dir is
    checked first: the code is only as safe as the folder it is kept in."""
    await check_work_dir(host, profile)
    version, bundle = backend_bundle()
    code_dir = f"{profile.paths.work_dir}/code/{version}"
    check = ["test", "-f", f"{code_dir}/.complete"]
    if (await host.run(check, timeout=30)).ok:
        return code_dir
    tar_path = f"{code_dir}.tar.gz"
    mk = ["mkdir", "-p", f"{profile.paths.work_dir}/code"]
    await host.run(mk, timeout=30, check=True)
    await host.upload(bundle, tar_path)
    unpack = ["sh", "-c", 'mkdir -p "$1" && tar -xzf "$2" -C "$1" && touch "$1/.complete" && rm -f "$2"',
              "sh", code_dir, tar_path]
    shown.append(f"(upload backend {version}) {shlex.join(unpack)}")
    res = await host.run(unpack, timeout=120)
    if not res.ok:
        raise StageError(f"unpacking the backend on the host failed: {res.stderr.strip()}")
    return code_dir


# per Host object: does its systemd-run know --expand-environment (v254+)? Asked once.
_NO_EXPAND_OPTION: "weakref.WeakKeyDictionary[object, bool]" = weakref.WeakKeyDictionary()


async def systemd_run_expands(host: Host) -> bool:
    """Whether the host's systemd-run has --expand-environment=no (v254+); otherwise `$` is escaped
    (units.systemd_literal_argv), which the older service manager unescapes."""
    with contextlib.suppress(KeyError, TypeError):
        return _NO_EXPAND_OPTION[host]
    res = await host.run(["systemd-run", "--help"], timeout=30)
    found = "--expand-environment" in res.stdout
    with contextlib.suppress(TypeError):
        _NO_EXPAND_OPTION[host] = found
    return found


async def resolve_dataset(host: Host, profile: Profile, dataset: str | None) -> str:
    """The absolute dataset path the detached stage will open, decided before the preflight.

    The stage runs elsewhere (its working directory is the work dir), so a relative path must be made
    absolute here, where it means something: on a local host against the caller's directory (where it
    was typed); on an SSH host against the profile's `[paths].data_dir` (the caller's directory is on
    another machine), and `~/...` against the remote user's home."""
    value = dataset or profile.generate.dataset
    if not value:
        raise StageError("no dataset: set [generate].dataset in the profile or pass --dataset PATH")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise StageError(f"dataset {value!r}: a path may not hold control characters (newline, NUL, tab)")
    if value != value.strip():
        raise StageError(f"dataset {value!r}: leading or trailing spaces (quote the path as a whole)")
    if profile.host.transport == "local":
        path = os.path.abspath(os.path.expanduser(value))
    elif value == "~" or value.startswith("~/"):
        res = await host.run(["sh", "-c", 'printf %s "$HOME"'], timeout=30)
        home = res.stdout.strip()
        if not res.ok or not home.startswith("/") or "\n" in home:
            raise StageError(f"dataset {value!r}: cannot tell the remote home directory ($HOME is "
                             f"{home!r}); give an absolute path")
        path = posixpath.normpath(home + value[1:])
    elif value.startswith("~"):
        raise StageError(f"dataset {value!r}: ~user paths are not resolved; give an absolute path")
    else:
        path = posixpath.normpath(posixpath.join(profile.paths.data_dir, value))
    if not path.startswith("/"):
        raise StageError(f"dataset {value!r}: resolves to {path!r}, which is not an absolute path")
    return path


async def upload_secret(host: Host, profile: Profile, secret: str | None, name: str) -> str | None:
    """The stage runs detached, where the console's environment does not reach: hand it a secret as a
    0600 file in a 0700 dir on the host, so it is in no command line, unit property or log."""
    if not secret:
        return None
    secrets_dir = f"{profile.paths.work_dir}/secrets"
    await host.run(["sh", "-c", 'umask 077 && mkdir -p "$1" && chmod 700 "$1"', "sh", secrets_dir],
                   timeout=30, check=True)
    path = f"{secrets_dir}/{name}"
    await host.upload(secret.encode() + b"\n", path, mode=0o600)
    return path


async def upload_api_key(host: Host, profile: Profile) -> str | None:
    return await upload_secret(host, profile, api_key(profile), "vllm-api-key")


async def upload_hub_token(host: Host, profile: Profile, shown: list[str] | None = None) -> str | None:
    """The Hub token for a gated or private drafter, handed over like the API key, and only when the profile
    says the repo needs it ([bench].hub_token_upload): the operator's personal token never goes to the
    host for a public repo. The stage removes it once read (--remove-token-file)."""
    if not profile.bench.hub_token_upload:
        return None
    warning = readable_secret_warning(profile.bench.hub_token_file)
    if warning and shown is not None:
        shown.append(f"(warning) {warning}")
    return await upload_secret(host, profile, hub_token(profile), "hf-token")


def readable_secret_warning(path: str | None) -> str | None:
    """A secret file on this machine that others can read: say so (it is used all the same)."""
    if not path:
        return None
    try:
        mode = os.stat(os.path.expanduser(path)).st_mode
    except OSError:
        return None
    if mode & 0o077:
        return (f"{path} can be read by others (mode {mode & 0o777:o}): `chmod 600 {path}`; it holds your "
                f"Hub token")
    return None


def check_host_path(value: str, what: str) -> str:
    """A path on the host given on the console's command line: absolute, no control characters."""
    from console.profile import check_path

    if problem := check_path(value):
        raise StageError(f"{what} {value!r}: expected {problem}")
    return value


def run_dir_path(profile: Profile, run_id: str) -> str:
    return f"{profile.paths.work_dir}/runs/{run_id}"


def _preflight_text(stdout: str, stderr: str) -> str:
    try:
        report = json.loads(stdout)
    except ValueError:
        return (stderr or stdout).strip()[-2000:]
    checks = report.get("checks") if isinstance(report, dict) else None
    if not isinstance(checks, list):
        return json.dumps(report)[:2000]
    lines = []
    for c in checks:
        if isinstance(c, dict) and not c.get("ok", True):
            fix = f" -> {c['fix']}" if c.get("fix") else ""
            lines.append(f"- {c.get('name')}: {c.get('detail')}{fix}")
    return "\n".join(lines) or json.dumps(report)[:2000]


async def stage_ended(host: Host, profile: Profile, unit: str) -> str | None:
    """None while the stage's unit (or tmux session) still runs; else how it ended, with its last log
    lines: what `run --wait` shows when a stage dies before it wrote a single event."""
    if profile.server.manager == "systemd":
        res = await host.run(["systemctl", "show", unit, "-p", "LoadState,ActiveState,Result,ExecMainStatus"],
                             timeout=30)
        props = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        if props.get("ActiveState") in ("active", "activating", "deactivating", "reloading"):
            return None
        if props.get("LoadState") == "not-found":  # --collect removed it: its journal says how it ended
            how = "the unit is gone"
        else:
            how = f"result {props.get('Result') or 'unknown'}, exit status {props.get('ExecMainStatus') or '?'}"
        log = await host.run(["journalctl", "-u", unit, "-n", "20", "-o", "cat", "--no-pager"], timeout=30)
    else:
        res = await host.run(["tmux", "list-panes", "-t", tmux_target(unit), "-F", "#{pane_dead}"], timeout=30)
        if res.ok and "0" in res.stdout.split():
            return None
        path = stage_log_path(profile, unit)
        status = await host.run(["cat", exit_status_path(path)], timeout=30)
        how = f"exit status {status.stdout.strip() or '?'}"
        log = await host.run(["tail", "-n", "20", path], timeout=30)
    # host text on the operator's terminal: no escape sequences (OSC 52 writes the clipboard)
    tail = clean_block("\n".join(log.stdout.strip().splitlines()[-20:]))
    return f"{unit} ended ({how})" + (f"; its last lines:\n{tail}" if tail else "")


async def stop_stage_unit(host: Host, profile: Profile, unit: str) -> list[str]:
    try:
        stop = stage_stop_command(profile, unit)
    except UnitNameError as exc:
        raise StageError(str(exc)) from None
    res = await host.run(stop.argv, timeout=180)
    if not res.ok:
        raise StageError(f"stopping {unit} failed: {(res.stderr or res.stdout).strip()}")
    return [stop.shown]


@dataclass(frozen=True)
class StageRequest:
    """What the operator asked to start: a stage (or `pipeline`) and its options."""
    stage: str
    run_id: str | None = None
    input_run: str | None = None  # the run it consumes; default the latest completed run before it
    fresh: bool = False
    dataset: str | None = None  # generate
    limit: int | None = None  # generate
    from_stage: str | None = None  # pipeline
    to_stage: str | None = None  # pipeline
    online: bool | None = None  # train (and pipeline): hidden states fetched during training; None: the profile's
    checkpoint: str | None = None  # verify: another drafter's checkpoint on the host (a fetched one)

    def is_online(self, profile: Profile | None = None) -> bool:
        """Online training: the request says so, else the profile's [extract] online."""
        return self.online if self.online is not None else bool(profile and profile.extract.online)


def pipeline_range(req: StageRequest, profile: Profile | None = None) -> list[str]:
    """The host stages a pipeline request runs, in order; online training has no extract stage (train
    consumes the prepare run and fetches hidden states itself)."""
    first = req.from_stage or PIPELINE_STAGES[0]
    last = req.to_stage or PIPELINE_STAGES[-1]
    for name in (first, last):
        if name not in PIPELINE_STAGES:
            raise StageError(f"unknown stage {name!r}: expected one of {', '.join(PIPELINE_STAGES)}")
    i, j = PIPELINE_STAGES.index(first), PIPELINE_STAGES.index(last)
    if i > j:
        raise StageError(f"--from {first} comes after --to {last} in the pipeline")
    stages = list(PIPELINE_STAGES[i:j + 1])
    if req.is_online(profile) and "extract" in stages:
        stages.remove("extract")
        if not stages:
            raise StageError("online training has no extract stage (train fetches the hidden states itself): "
                             "run --from prepare or --from train, or train offline (--no-online)")
    return stages


def stops_baseline(req: StageRequest, profile: Profile | None = None) -> bool:
    """Starting this stops the baseline server for a while: ask first. Extraction does (the extraction
    server needs the GPUs), online training and its verify too, and a bench (it serves the drafter for
    its second half)."""
    if req.stage == "bench":
        return True
    online = req.is_online(profile)
    stages = pipeline_range(req, profile) if req.stage == "pipeline" else [req.stage]
    return "extract" in stages or (online and ("train" in stages or "verify" in stages))


# the runs a server swap never starts beside: the other swaps (extract, bench, online train and verify)
# and training, whose GPUs the swapped-in server would take
SWAP_EXCLUSIVE = ("extract", "bench", "train", "verify", "pipeline")


def busy_stages(req: StageRequest, profile: Profile) -> list[str]:
    """The stages whose live runs refuse `req`: its own and a pipeline's (two runs would fight over the same
    GPUs and files); a download needs no GPU, so it may run beside a pipeline run, never beside another
    download; a request that swaps the servers never runs beside another swap nor beside training."""
    if req.stage == FETCH_DRAFTER:
        return [FETCH_DRAFTER]
    busy = ["pipeline", *pipeline_range(req, profile)] if req.stage == "pipeline" else [req.stage, "pipeline"]
    if stops_baseline(req, profile):
        busy += [s for s in SWAP_EXCLUSIVE if s not in busy]
    return busy


class _Launcher:
    """Builds one stage's command line on the host's terms: inputs it defaults to, files it needs there."""

    def __init__(self, host: Host, profile: Profile, env: dict[str, str], shown: list[str]):
        self.host, self.profile, self.env, self.shown = host, profile, env, shown

    async def host_query(self, argv: list[str], what: str) -> str:
        cmd = ["env", *(f"{k}={v}" for k, v in self.env.items()), *argv]
        res = await self.host.run(cmd, timeout=120)
        if not res.ok:
            raise StageError(f"{what}: {clean_block((res.stderr or res.stdout).strip()) or f'exit {res.returncode}'}")
        return res.stdout.strip()

    async def input_run(self, stage: str, given: str | None, online: bool = False) -> str | None:
        before = "prepare" if stage == "train" and online else INPUT_STAGE.get(stage)
        if given or before is None:
            return given and check_run_id(given)
        return await self.host_query(stage_argv.latest_argv(self.profile, before),
                                     f"no input for {stage} (pass --input RUN)")

    async def argv(self, stage: str, run_id: str, input_run: str | None, req: StageRequest,
                   ) -> tuple[list[str], list[str] | None]:
        """(the stage's command, its preflight command or None)."""
        p, fresh = self.profile, req.fresh
        try:
            if stage == "generate":
                dataset = await resolve_dataset(self.host, p, req.dataset)
                key = await upload_api_key(self.host, p)
                return (stage_argv.generate_argv(p, run_id, dataset=dataset, limit=req.limit, fresh=fresh,
                                                 api_key_path=key),
                        stage_argv.generate_argv(p, run_id, dataset=dataset, limit=req.limit, fresh=fresh,
                                                 api_key_path=key, preflight_only=True))
            if stage == "prepare":
                return stage_argv.prepare_argv(p, run_id, input_run or "", fresh=fresh), None
            if stage == "extract":
                ids = json.loads(await self.host_query(stage_argv.aux_layers_argv(p), "aux layer ids"))
                plan_file = await self.upload_swap_plan(run_id, ids["aux_layer_ids"], ids["num_layers"])
                return (stage_argv.extract_argv(p, run_id, input_run or "", plan_file=plan_file,
                                                aux_layer_ids=ids["aux_layer_ids"], fresh=fresh),
                        stage_argv.extract_argv(p, run_id, input_run or "", plan_file=plan_file,
                                                aux_layer_ids=ids["aux_layer_ids"], fresh=fresh, preflight_only=True))
            if stage in ("train", "verify") and req.is_online(p):
                # the extraction server takes the baseline's place for the stage (backend/swap.py)
                ids = json.loads(await self.host_query(stage_argv.aux_layers_argv(p), "aux layer ids"))
                plan_file = await self.upload_swap_plan(run_id, ids["aux_layer_ids"], ids["num_layers"])
                if stage == "verify":
                    if req.checkpoint is not None:
                        check_host_path(req.checkpoint, "--checkpoint")
                    return stage_argv.verify_argv(p, run_id, input_run, fresh=fresh, plan_file=plan_file,
                                                  checkpoint=req.checkpoint), None
                return (stage_argv.train_argv(p, run_id, input_run, fresh=fresh, plan_file=plan_file),
                        stage_argv.train_argv(p, run_id, input_run, fresh=fresh, plan_file=plan_file,
                                              preflight_only=True))
            if stage == "train":
                return (stage_argv.train_argv(p, run_id, input_run, fresh=fresh),
                        stage_argv.train_argv(p, run_id, input_run, fresh=fresh, preflight_only=True))
            if stage == "verify":
                if req.checkpoint is not None:
                    check_host_path(req.checkpoint, "--checkpoint")
                return stage_argv.verify_argv(p, run_id, input_run, fresh=fresh, checkpoint=req.checkpoint), None
            if stage == FETCH_DRAFTER:
                token = await upload_hub_token(self.host, p, self.shown)
                return stage_argv.fetch_drafter_argv(p, run_id, token_path=token, fresh=fresh), None
        except (stage_argv.StageArgError, ExtractionPlanError) as exc:
            raise StageError(str(exc)) from None
        raise StageError(f"stage {stage!r} cannot be started from this version of the console")

    async def bench_pair(self, run_id: str, req: StageRequest) -> list[str]:
        """The bench of the baseline against the verified drafter (backend/benchpair.py): its plan uploaded,
        its command line returned. `req.input_run`: the verify (or train) run whose checkpoint to bench."""
        p = self.profile
        found = json.loads(await self.host_query(ds.servable_argv(p, req.input_run), "no drafter to bench"))
        third = None
        if p.bench.third_drafter:  # the profile names a published drafter: it is benched in the same table
            third = json.loads(await self.host_query(ds.servable_argv(p, third=True),
                                                     f"no published drafter ({p.bench.third_drafter}) to bench"))
        prompts_run = None
        if not p.bench.dataset:
            prompts_run = await self.host_query(stage_argv.latest_argv(p, "prepare"),
                                                "no prompts for the bench (set [bench].dataset, or run prepare)")
        key = await upload_api_key(self.host, p)
        no_expand = p.server.manager == "systemd" and await systemd_run_expands(self.host)
        try:
            program = await read_server_program(self.host, p)
            plan = pair_plan(p, run_id, str(found["checkpoint"]), input_run=prompts_run, api_key_path=key,
                             no_expand_option=no_expand, third_checkpoint=third and str(third["checkpoint"]),
                             program=program)
        except (ds.DrafterServerError, OperatorUnitError, ValueError) as exc:
            raise StageError(str(exc)) from None
        plan_file = f"{p.paths.work_dir}/plans/{run_id}.json"
        await self.host.run(["mkdir", "-p", f"{p.paths.work_dir}/plans"], timeout=30, check=True)
        await self.host.upload(json.dumps(plan, indent=2).encode(), plan_file)
        self.shown.append(f"(bench) drafter {found['checkpoint']} (verified by {found['run_id']})")
        self.shown.extend(f"(bench {k}) {shlex.join(plan[k]['argv'])}" for k in ("baseline", "drafter"))
        if program.note:
            self.shown.append(f"(bench) note: {program.note}")
        return pair_argv(p, run_id, plan_file, fresh=req.fresh)

    async def upload_swap_plan(self, run_id: str, aux_layer_ids: list[int], num_layers: int) -> str:
        try:
            program = await read_server_program(self.host, self.profile)
        except OperatorUnitError as exc:
            raise StageError(str(exc)) from None
        plan = build_plan(self.profile, run_id, aux_layer_ids, num_layers, program)
        if program.note:
            self.shown.append(f"(server swap) note: {program.note}")
        path = plan_path(self.profile, run_id)
        await self.host.run(["mkdir", "-p", path.rsplit("/", 1)[0]], timeout=30, check=True)
        await self.host.upload(json.dumps(plan, indent=2).encode(), path)
        self.shown.extend(f"(server swap) {line}" for line in describe_plan(plan))
        return path

    async def preflight(self, argv: list[str]) -> None:
        cmd = ["env", *(f"{k}={v}" for k, v in self.env.items()), *argv]
        self.shown.append(shlex.join(cmd))
        res = await self.host.run(cmd, timeout=300)
        if not res.ok:
            raise StageError("preflight failed:\n" + clean_block(_preflight_text(res.stdout, res.stderr)))

    async def pipeline_plan(self, chain_id: str, req: StageRequest) -> list[PlannedStage]:
        stages = pipeline_range(req, self.profile)
        planned: list[PlannedStage] = []
        previous = await self.input_run(stages[0], req.input_run, req.is_online(self.profile))
        for stage in stages:
            run_id = chain_stage_run_id(chain_id, stage)
            argv, preflight = await self.argv(stage, run_id, previous, req)
            if stage == stages[0] and preflight is not None:
                await self.preflight(preflight)  # the first stage is checked now, the rest when they start
            planned.append(PlannedStage(stage, run_id, tuple(argv), {}))
            previous = run_id
        return planned


async def launch_stage(host: Host, profile: Profile, req: StageRequest) -> Launch:
    """Start a stage program (or a pipeline run of several) detached on the host; return where it runs."""
    stage = req.stage
    run_id = check_run_id(req.run_id or new_run_id(stage))
    unit = stage_unit_name(stage, run_id)
    shown: list[str] = []
    code_dir = await ensure_backend(host, profile, shown)
    env = {"PYTHONPATH": code_dir, "PYTHONUNBUFFERED": "1", UNIT_ENV: unit}
    launcher = _Launcher(host, profile, env, shown)
    stop_timeout = 120.0
    if stage == "bench":
        argv = await launcher.bench_pair(run_id, req)
        # on SIGTERM the bench stops, then the drafter server stops and the baseline starts again
        stop_timeout = EXTRACT_STOP_S + 4 * profile.server.stop_timeout_s
    elif stage == "pipeline":
        plan = await launcher.pipeline_plan(run_id, req)
        plan_file = f"{profile.paths.work_dir}/plans/{run_id}.json"
        await host.run(["mkdir", "-p", f"{profile.paths.work_dir}/plans"], timeout=30, check=True)
        await host.upload(dumps_plan(plan).encode(), plan_file)
        shown.extend(f"(pipeline {p.stage}) {shlex.join(p.argv)}" for p in plan)
        argv = stage_argv.chain_argv(profile, run_id, plan_file, fresh=req.fresh)
        if stops_baseline(req, profile):
            stop_timeout = EXTRACT_STOP_S + 4 * profile.server.stop_timeout_s
    else:
        if stage not in (*PIPELINE_STAGES, FETCH_DRAFTER):
            raise StageError(f"stage {stage!r} cannot be started from this version of the console yet")
        input_run = await launcher.input_run(stage, req.input_run, req.is_online(profile))
        argv, preflight = await launcher.argv(stage, run_id, input_run, req)
        if preflight is not None:
            await launcher.preflight(preflight)
        if stops_baseline(req, profile):
            # on SIGTERM it still stops the extraction server and starts the baseline again
            stop_timeout = EXTRACT_STOP_S + 4 * profile.server.stop_timeout_s
    no_expand = profile.server.manager == "systemd" and await systemd_run_expands(host)
    try:
        start = stage_start_command(profile, unit, argv, log_path=stage_log_path(profile, unit),
                                    cwd=profile.paths.work_dir, env=env, no_expand_option=no_expand,
                                    stop_timeout_s=stop_timeout)
    except UnitNameError as exc:
        raise StageError(str(exc)) from None
    shown.append(start.shown)
    res = await host.run(start.argv, timeout=60)
    if not res.ok:
        raise StageError(f"starting {unit} failed (exit {res.returncode}): "
                         f"{clean_block((res.stderr or res.stdout).strip())}")
    return Launch(run_id=run_id, unit=unit, run_dir=run_dir_path(profile, run_id), commands=shown)
