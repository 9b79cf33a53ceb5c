"""Launch, stop and find stage programs on the host.

A stage is `<host python> -m backend.<stage> ...` started detached (systemd-run or tmux, see control/units.py),
so losing the console or SSH never kills it. The backend code is uploaded first, addressed by a hash of
its content: a host whose copy is older gets the new one, a host that has it already gets nothing.
"""
from __future__ import annotations

import asyncio
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
from console.parsers.text import clean, clean_block
from backend.chain.plan import ChainPlan, Hold, PlannedStage, chain_stage_run_id, dumps_plan
from backend.drafter.context import context_warning, served_context
from backend.contract.events import UNIT_ENV
from backend.contract.runs import RunDirError
from backend.contract.runs import check_run_id as _check_run_id
from backend.kit.gpu_owners import GpuPlan, OwnershipError
from backend.kit.redact import shown as redacted_shown
from console.naming import is_stage_unit
from backend.kit.serverlock import lock_path
from backend.kit import secret_files
from console.control import stage_argv, stages
from console.control import drafter_server as ds
from console.control.bench_pair import check_against_trained, pair_argv, pair_plan
from console.control.extraction import ExtractionPlanError, build_plan, describe_plan, plan_path
from console.control.gpu_plan import gpu_plan
from console.control.switch_plan import switch_plan
from console.control.permissions import check_permission
from console.control.operator_unit import OperatorUnitError, read_server_program, unit_user_refusal
from console.control.units import (ServerProgram, UnitNameError, exit_status_path, stage_log_path, stage_start_command,
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
# can replace the code a stage runs, the plan a swap follows, or a run's events; state/ holds the server
# lock, secrets/ the API key and Hub token the console hands a stage.
TRUSTED_DIRS = ("", "code", "plans", "runs", "state", "secrets")
PRIVATE_DIRS = ("secrets",)  # not even the user's own group may write there


def work_dir_problem(text: str, private: tuple[str, ...] = ()) -> str | None:
    """What is wrong with the work dir's folders from `id -u; id -g; stat -L -c '%u %g %a %n' DIRS` (pure):
    a folder that others can write (a group write bit only for a group other than the user's own; any group
    write bit for the `private` paths), or that belongs to another user than this one or root. None when
    all are sound."""
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
        if mode & 0o020 and (group != gid or path in private):
            writers.append(f"group {group}")
        if owner not in (uid, "0"):
            writers.append(f"its owner, user {owner}")
        if writers:
            return (f"{path} can be written by {' and '.join(writers)} (mode {mode_text}): whoever writes there "
                    f"can replace the code the stages run or the plans they follow; make it yours and "
                    f"`chmod go-w` it (work dir, code/, plans/, runs/, state/, secrets/)")
    return None


async def check_work_dir(host: Host, profile: Profile) -> None:
    """Create the work dir's trusted folders if needed, and refuse them when others can write there."""
    dirs = [posixpath.join(profile.paths.work_dir, d) if d else profile.paths.work_dir for d in TRUSTED_DIRS]
    script = 'mkdir -p -- "$@" && id -u && id -g && stat -L -c "%u %g %a %n" -- "$@"'
    res = await host.run(["sh", "-c", script, "sh", *dirs], timeout=30)
    if not res.ok:
        raise StageError(f"the work dir {profile.paths.work_dir} is not usable: "
                         f"{clean_block((res.stderr or res.stdout).strip())[:300]}")
    private = tuple(posixpath.join(profile.paths.work_dir, d) for d in PRIVATE_DIRS)
    problem = work_dir_problem(res.stdout, private)
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
    0600 file in a 0700 dir on the host, so it is in no command line, unit property or log. Who removes
    it, and when: backend/kit/secret_files.py."""
    if not secret:
        return None
    secrets_dir = secret_files.secrets_dir(profile.paths.work_dir)
    # the shared key file consoles before per-run copies left behind goes too: nothing reads it any more
    legacy = posixpath.join(secrets_dir, LEGACY_API_KEY)
    await host.run(["sh", "-c", 'umask 077 && mkdir -p "$1" && chmod 700 "$1" && rm -f "$2"', "sh", secrets_dir,
                    legacy], timeout=30, check=True)
    path = posixpath.join(secrets_dir, name)
    await host.upload(secret.encode() + b"\n", path, mode=0o600)
    return path


LEGACY_API_KEY = "vllm-api-key"


async def upload_api_key(host: Host, profile: Profile, run_id: str) -> str | None:
    """The vLLM API key for one start of `run_id`: its own copy (secret_files.api_key_file_name), which
    the program that reads it removes once read, or the bench pair or pipeline that runs the readers at its
    end; None when the profile has no key."""
    return await upload_secret(host, profile, api_key(profile), secret_files.api_key_file_name(run_id))


async def remove_secrets(host: Host, paths: list[str]) -> None:
    """A start that failed before its program ran (a preflight refused, the start command failed): the
    secrets uploaded for it go, as the program would have removed them. Best effort: the start's own error
    is what the operator must see."""
    if not paths:
        return
    with contextlib.suppress(Exception):
        await host.run(["rm", "-f", "--", *paths], timeout=30)


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
    try:
        return stage_argv.check_host_path(value, what)
    except stage_argv.StageArgError as exc:
        raise StageError(str(exc)) from None


def run_dir_path(profile: Profile, run_id: str) -> str:
    return f"{profile.paths.work_dir}/runs/{run_id}"


PREFLIGHT_WARNING = "warning (preflight):"


def preflight_warnings(stdout: str) -> list[str]:
    """The failed warning checks of a `--preflight-only` JSON report (backend/kit/preflight.py), at most 20."""
    try:
        report = json.loads(stdout)
    except ValueError:
        return []
    checks = report.get("checks") if isinstance(report, dict) else None
    out = []
    for c in checks if isinstance(checks, list) else []:
        if isinstance(c, dict) and c.get("warning") is True and c.get("ok") is False:
            fix = f" -> {c['fix']}" if c.get("fix") else ""
            out.append(f"{c.get('name')}: {str(c.get('detail'))[:600]}{str(fix)[:600]}")
    return out[:20]


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


STAGE_STOP_S = 120.0  # a stage that never holds the GPUs: SIGTERM, then this long before SIGKILL


def gpu_stop_timeout(profile: Profile) -> float:
    """A stage holding the GPUs stops its server and starts the baseline again on SIGTERM: that long."""
    return EXTRACT_STOP_S + 4 * profile.server.stop_timeout_s


def stage_stop_timeout(profile: Profile, unit: str) -> float:
    """The stop budget of a stage's unit, as its start gave systemd (TimeoutStopSec): a stage that may hold
    the GPUs (whether it trains online is not known at its stop: it may) or a pipeline gets the swap's."""
    for name in stages.names():
        if is_stage_unit(unit, (name,)):
            spec = stages.get(name)
            return gpu_stop_timeout(profile) if spec.kind == "chain" or spec.takes_gpus != "no" \
                else STAGE_STOP_S
    return STAGE_STOP_S


async def stop_stage_unit(host: Host, profile: Profile, unit: str) -> list[str]:
    budget = stage_stop_timeout(profile, unit)
    try:
        stop = stage_stop_command(profile, unit, stop_timeout_s=budget)
    except UnitNameError as exc:
        raise StageError(str(exc)) from None
    res = await host.run(stop.argv, timeout=budget + 60)
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
    k_values: tuple[int, ...] | None = None  # bench: our drafter at each K; None: the profile's [bench].k_values
    yes: bool = False  # the operator said --yes: a bench goes on past the served-context warning

    def is_online(self, profile: Profile | None = None) -> bool:
        """Online training: the request says so, else the profile's [extract] online."""
        return self.online if self.online is not None else bool(profile and profile.extract.online)

    def bench_k_values(self, profile: Profile) -> tuple[tuple[int, ...], str]:
        """The K values a bench compares (empty: the profile's one K) and where they were asked for (the
        flag, or the profile's file and key), for a refusal that names it."""
        if self.k_values is not None:
            return tuple(self.k_values), "--k"
        return tuple(profile.bench.k_values), f"{profile.source or 'the profile'}: bench.k_values"


def pipeline_range(req: StageRequest, profile: Profile | None = None) -> list[str]:
    """The host stages a pipeline request runs, in order (the table's `in_pipeline` rows); online training
    has no extract stage (train consumes the prepare run and fetches hidden states itself)."""
    chain = stages.pipeline_stages()
    first = req.from_stage or chain[0]
    last = req.to_stage or chain[-1]
    for name in (first, last):
        if name not in chain:
            raise StageError(f"unknown stage {name!r}: expected one of {', '.join(chain)}")
    i, j = chain.index(first), chain.index(last)
    if i > j:
        raise StageError(f"--from {first} comes after --to {last} in the pipeline")
    picked = list(chain[i:j + 1])
    if req.is_online(profile):
        skipped = [s for s in picked if stages.get(s).skip_online]
        picked = [s for s in picked if s not in skipped]
        if skipped and not picked:
            raise StageError(f"online training has no {' or '.join(skipped)} stage (train fetches the hidden states "
                             "itself): run --from prepare or --from train, or train offline (--no-online)")
    return picked


def _takes_gpus(stage: stages.Stage, online: bool) -> bool:
    return stage.takes_gpus == "always" or (stage.takes_gpus == "online" and online)


def stops_baseline(req: StageRequest, profile: Profile | None = None) -> bool:
    """Starting this stops the baseline server for a while: ask first. The table says which stages take
    the GPUs from it (extraction, a bench, online training and its verify); a pipeline run does when one
    of its stages does."""
    spec = _spec(req.stage)
    online = req.is_online(profile)
    if spec.kind == "chain":
        return any(_takes_gpus(stages.get(s), online) for s in pipeline_range(req, profile))
    return _takes_gpus(spec, online)


def __getattr__(name: str):
    # the runs a server swap never starts beside, as the stage table says (read at call time)
    if name == "SWAP_EXCLUSIVE":
        return stages.swap_exclusive()
    raise AttributeError(name)


def busy_stages(req: StageRequest, profile: Profile) -> list[str]:
    """The stages whose live runs refuse `req`: its own and a pipeline's (two runs would fight over the same
    GPUs and files); a stage that shares nothing with a pipeline run (a download) may run beside one, never
    beside another of its own; a request that swaps the servers never runs beside another swap nor beside a
    stage computing on the GPUs."""
    spec = _spec(req.stage)
    if spec.beside_chain:
        return [spec.name]
    chain = stages.chain_stage()
    busy = [chain, *pipeline_range(req, profile)] if spec.kind == "chain" else [spec.name, chain]
    if stops_baseline(req, profile):
        busy += [s for s in stages.swap_exclusive() if s not in busy]
    return busy


def _spec(name: str) -> stages.Stage:
    try:
        return stages.get(name)
    except stages.UnknownStage:
        raise StageError(f"unknown stage {name!r}: expected one of {', '.join(stages.names())}") from None


class Launcher:
    """What a stage's argv builder (control/stages.py) may ask for: the host and the profile, the inputs
    it defaults to, the files it needs there. It collects what it ran for the operator (`shown`)."""

    def __init__(self, host: Host, profile: Profile, env: dict[str, str], shown: list[str]):
        self.host, self.profile, self.env, self.shown = host, profile, env, shown
        self.secrets: list[str] = []  # the secret files uploaded for this start (removed when it fails)

    async def host_query(self, argv: list[str], what: str) -> str:
        cmd = ["env", *(f"{k}={v}" for k, v in self.env.items()), *argv]
        res = await self.host.run(cmd, timeout=120)
        if not res.ok:
            raise StageError(f"{what}: {clean_block((res.stderr or res.stdout).strip()) or f'exit {res.returncode}'}")
        return res.stdout.strip()

    async def input_run(self, stage: str, given: str | None, online: bool = False) -> str | None:
        spec = _spec(stage)
        before = spec.online_input if online and spec.online_input else spec.input_stage
        if given or before is None:
            return given and check_run_id(given)
        return await self.latest(before, f"no input for {stage} (pass --input RUN)")

    async def latest(self, stage: str, what: str) -> str:
        """The latest completed run of `stage`, as the host names it. The answer goes into command lines
        the console runs and prints: a run id (whole-string check), or a refusal."""
        found = await self.host_query(stage_argv.latest_argv(self.profile, stage), what)
        try:
            return check_run_id(found)
        except StageError:
            raise StageError(f"{what}: the host's answer is not a run id: {clean(found)[:200]!r}") from None

    async def dataset(self, given: str | None) -> str:
        return await resolve_dataset(self.host, self.profile, given)

    async def api_key(self, run_id: str) -> str | None:
        return self._uploaded(await upload_api_key(self.host, self.profile, run_id))

    async def hub_token(self) -> str | None:
        return self._uploaded(await upload_hub_token(self.host, self.profile, self.shown))

    def _uploaded(self, path: str | None) -> str | None:
        if path:
            self.secrets.append(path)
        return path

    async def aux_layer_ids(self) -> tuple[list[int], int]:
        """The aux layer ids the verifier takes and its layer count (the extraction server is asked for
        both: backend/kit/verifier.extraction_layer_ids)."""
        answer = await self.host_query(stage_argv.aux_layers_argv(self.profile), "aux layer ids")
        try:
            found = json.loads(answer)
            ids, layers = found["aux_layer_ids"], found["num_layers"]
        except (ValueError, KeyError, TypeError):
            ids = layers = None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or \
                not isinstance(layers, int) or isinstance(layers, bool):
            raise StageError(f"aux layer ids: the host's answer is not a list of layer ids and a layer count: "
                             f"{clean(answer)[:200]!r}")
        return ids, layers

    async def vllm_floor(self) -> None:
        """Refuses, before the swap stops the baseline, an extraction the host's vLLM cannot do (the
        DeepSeek-V2 family's final state from 0.25.0 only: backend/kit/vllm_floor.py); the baseline's
        /version is the version the extraction server starts with (both run the unit's program)."""
        answer = await self.host_query(stage_argv.vllm_floor_argv(self.profile), "the vLLM version check")
        try:
            found = json.loads(answer)
            floor, refusal, version = str(found["floor"]), found["refusal"], found["version"]
        except (ValueError, KeyError, TypeError):
            raise StageError(f"the vLLM version check: the host's answer is not one: {clean(answer)[:200]!r}") from None
        if refusal:
            raise StageError(clean(f"{refusal}. Upgrade vLLM on the host (the program the unit "
                                   f"{self.profile.server.unit} runs) to {floor} or later; nothing was stopped"))
        if version:
            self.shown.append(clean(f"(server swap) the baseline runs vLLM {version}; extraction needs >= {floor}"))
        else:
            self.shown.append(clean(f"(server swap) vLLM version not checked ({found.get('note')}); extraction "
                                    f"needs >= {floor}: {found.get('why')}"))

    async def swap_plan(self, run_id: str) -> tuple[str, list[int]]:
        """The server swap plan of a stage that takes the GPUs (uploaded), and the aux layer ids in it."""
        ids, layers = await self.aux_layer_ids()
        await self.vllm_floor()
        return await self.upload_swap_plan(run_id, ids, layers), ids

    async def argv(self, stage: str, run_id: str, input_run: str | None, req: StageRequest,
                   ) -> tuple[list[str], list[str] | None]:
        """(the stage's command, its preflight command or None), by its row's builder."""
        spec = _spec(stage)
        if spec.build is None:
            raise StageError(f"stage {stage!r} is not started as a run (it is a server the console drives)")
        try:
            return await spec.build(self, run_id, input_run, req)
        except (stage_argv.StageArgError, ExtractionPlanError) as exc:
            raise StageError(str(exc)) from None

    async def bench_pair(self, run_id: str, req: StageRequest) -> list[str]:
        """The bench of the baseline against the verified drafter (backend/benchpair.py): its plan uploaded,
        its command line returned. `req.input_run`: the verify (or train) run whose checkpoint to bench."""
        p = self.profile
        found = json.loads(await self.host_query(ds.servable_argv(p, req.input_run), "no drafter to bench"))
        k_values, asked_in = req.bench_k_values(p)
        trained_k = found.get("trained_k")
        if k_values:
            try:
                check_against_trained(k_values, trained_k if isinstance(trained_k, int) else None,
                                      str(found["checkpoint"]), asked_in)
            except ValueError as exc:
                raise StageError(clean(str(exc))) from None
        third = None
        if p.bench.third_drafter:  # the profile names a published drafter: it is benched in the same table
            third = json.loads(await self.host_query(ds.servable_argv(p, third=True),
                                                     f"no published drafter ({p.bench.third_drafter}) to bench"))
        prompts_run = None
        if not p.bench.dataset:
            prompts_run = await self.latest(
                "prepare", "no prompts for the bench (set [bench].dataset, or run prepare)")
        key = await self.api_key(run_id)  # one copy every bench reads; the pair removes it at its end
        no_expand = p.server.manager == "systemd" and await systemd_run_expands(self.host)
        try:
            program = await read_server_program(self.host, p)
            self.context_check(program, found, refuse=not req.yes)
            plan = pair_plan(p, run_id, str(found["checkpoint"]), input_run=prompts_run, api_key_path=key,
                             no_expand_option=no_expand, third_checkpoint=third and str(third["checkpoint"]),
                             program=program, k_values=k_values)
        except (ds.DrafterServerError, OperatorUnitError, ValueError) as exc:
            raise StageError(str(exc)) from None
        plan_file = f"{p.paths.work_dir}/plans/{run_id}.json"
        await self.host.run(["mkdir", "-p", f"{p.paths.work_dir}/plans"], timeout=30, check=True)
        await self.host.upload(json.dumps(plan, indent=2).encode(), plan_file)
        self.shown.append(clean(f"(bench) drafter {found['checkpoint']} (verified by {found['run_id']})"))
        self.shown.extend(f"(bench {b.get('title', 'baseline')}) {redacted_shown(b['argv'])}"
                          for b in (plan["baseline"], *plan["contenders"]))
        if program.note:
            self.shown.append(f"(bench) note: {program.note}")
        return pair_argv(p, run_id, plan_file, fresh=req.fresh, secret_files=self.secrets)

    def context_check(self, program: ServerProgram, found: dict[str, object], *, refuse: bool) -> None:
        """The served context (the baseline's --max-model-len) against the drafter's max_position_embeddings
        (backend/drafter/context.py): longer, a bench is refused unless the operator said --yes, then shown."""
        length = found.get("max_position_embeddings")
        drafter_len = length if isinstance(length, int) and not isinstance(length, bool) else None
        warning = context_warning(served_context(program.argv), drafter_len, str(found.get("checkpoint")))
        if warning is None:
            return
        if refuse:
            raise StageError(clean(f"{warning}; nothing was stopped. Serve a shorter --max-model-len, or bench "
                                   f"anyway with `run bench --yes`"))
        self.shown.append(clean(f"(bench) warning: {warning}"))

    async def served_context(self) -> int | None:
        """The baseline's --max-model-len, read from its command (None: not given there, or not readable)."""
        try:
            return served_context((await read_server_program(self.host, self.profile)).argv)
        except OperatorUnitError:
            return None

    async def upload_swap_plan(self, run_id: str, aux_layer_ids: list[int], num_layers: int) -> str:
        try:
            program = await read_server_program(self.host, self.profile)
        except OperatorUnitError as exc:
            raise StageError(str(exc)) from None
        if program.user:
            who = await self.host_query(["id", "-un"], "the SSH user's name")
            if refused := unit_user_refusal(program, self.profile.server.unit, who, self.profile.paths.work_dir):
                raise StageError(clean(refused))
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
        self.shown.append(redacted_shown(cmd))
        res = await self.host.run(cmd, timeout=300)
        if not res.ok:
            raise StageError("preflight failed:\n" + clean_block(_preflight_text(res.stdout, res.stderr)))
        # warnings (the host's integrity: two vLLM installs, an old driver) are said, never a refusal
        self.shown.extend(clean(f"{PREFLIGHT_WARNING} {w}") for w in preflight_warnings(res.stdout))

    async def pipeline_plan(self, chain_id: str, req: StageRequest) -> str:
        """Each stage of a pipeline run planned (its argv by its row), the plan uploaded; its path."""
        names = pipeline_range(req, self.profile)
        planned: list[PlannedStage] = []
        previous = await self.input_run(names[0], req.input_run, req.is_online(self.profile))
        for stage in names:
            run_id = chain_stage_run_id(chain_id, stage)
            argv, preflight = await self.argv(stage, run_id, previous, req)
            if stage == names[0] and preflight is not None:
                await self.preflight(preflight)  # the first stage is checked now, the rest when they start
            planned.append(PlannedStage(stage, run_id, tuple(argv), {}))
            previous = run_id
        plan_file = f"{self.profile.paths.work_dir}/plans/{chain_id}.json"
        await self.host.run(["mkdir", "-p", f"{self.profile.paths.work_dir}/plans"], timeout=30, check=True)
        # the chain holds the server lock when a stage switches servers, and the baseline down across the
        # hold the GPU plan asks for (one stop, one start at the end)
        gpus = request_gpu_plan(req, self.profile)
        hold = Hold(gpus.hold[0], gpus.hold[1], switch_plan(self.profile, [])) if gpus.hold else None
        lock = lock_path(self.profile.paths.work_dir) if stops_baseline(req, self.profile) else ""
        await self.host.upload(dumps_plan(ChainPlan(planned, lock, hold)).encode(), plan_file)
        self.shown.extend(f"(pipeline {p.stage}) {redacted_shown(p.argv)}" for p in planned)
        return plan_file


async def require_permission(host: Host, profile: Profile) -> None:
    """StageError with the fix when the SSH user may not manage systemd units (console/control/permissions.py)."""
    verdict = await check_permission(host, profile)
    if verdict is not None and not verdict.ok:
        raise StageError(verdict.message)


def request_gpu_plan(req: StageRequest, profile: Profile) -> GpuPlan:
    """Who holds which GPUs at each step of `req` (backend/kit/gpu_owners.py); StageError when they cannot be
    shared as asked (online training where the extraction server and the trainer would share a GPU)."""
    names = pipeline_range(req, profile) if req.stage == "pipeline" else [req.stage]
    try:
        return gpu_plan(profile, names, online=req.is_online(profile), chain=req.stage == "pipeline")
    except OwnershipError as exc:
        raise StageError(str(exc)) from None


def checked_gpu_plan(req: StageRequest, profile: Profile, shown: list[str]) -> GpuPlan:
    plan = request_gpu_plan(req, profile)
    if stops_baseline(req, profile) or plan.hold or any(s.stops_first for s in plan.steps):
        # e.g. a train run alone on GPUs the baseline holds: its preflight refuses until the server is stopped
        shown.extend(f"(gpus) {line}" for line in plan.describe())
    return plan


async def launch_stage(host: Host, profile: Profile, req: StageRequest) -> Launch:
    """Start a stage program (or a pipeline run of several) detached on the host, as its row in the stage
    table says; return where it runs."""
    spec = _spec(req.stage)
    if spec.build is None:
        raise StageError(f"stage {req.stage!r} is not started as a run (it is a server the console drives)")
    run_id = check_run_id(req.run_id or new_run_id(spec.name))
    unit = stage_unit_name(spec.name, run_id)
    await require_permission(host, profile)  # systemd-run and systemctl stop/start: before anything else
    shown: list[str] = []
    code_dir = await ensure_backend(host, profile, shown)
    env = {"PYTHONPATH": code_dir, "PYTHONUNBUFFERED": "1", UNIT_ENV: unit}
    launcher = Launcher(host, profile, env, shown)
    checked_gpu_plan(req, profile, shown)  # refused here when the GPUs cannot be shared as asked
    input_run = await launcher.input_run(spec.name, req.input_run, req.is_online(profile)) \
        if spec.kind == "run" else req.input_run
    try:
        await _start(host, profile, req, spec, launcher, run_id, unit, input_run)
    except BaseException:
        # the program never ran, so nothing else removes what was uploaded for it; a cancelled console
        # (the operator quit mid-start) tries too
        await asyncio.shield(remove_secrets(host, launcher.secrets))
        raise
    return Launch(run_id=run_id, unit=unit, run_dir=run_dir_path(profile, run_id), commands=shown)


async def _start(host: Host, profile: Profile, req: StageRequest, spec: stages.Stage, launcher: Launcher,
                 run_id: str, unit: str, input_run: str | None) -> None:
    """The stage's command (and its preflight, run first), then its detached start; StageError when
    either is refused."""
    argv, preflight = await launcher.argv(spec.name, run_id, input_run, req)
    if preflight is not None:
        await launcher.preflight(preflight)
    # on SIGTERM a stage holding the GPUs still stops its server and starts the baseline again
    stop_timeout = gpu_stop_timeout(profile) if stops_baseline(req, profile) else STAGE_STOP_S
    no_expand = profile.server.manager == "systemd" and await systemd_run_expands(host)
    try:
        start = stage_start_command(profile, unit, argv, log_path=stage_log_path(profile, unit),
                                    cwd=profile.paths.work_dir, env=launcher.env, no_expand_option=no_expand,
                                    stop_timeout_s=stop_timeout)
    except UnitNameError as exc:
        raise StageError(str(exc)) from None
    launcher.shown.append(start.shown)
    res = await host.run(start.argv, timeout=60)
    if not res.ok:
        raise StageError(f"starting {unit} failed (exit {res.returncode}): "
                         f"{clean_block((res.stderr or res.stdout).strip())}")
