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
import re
import shlex
import tarfile
import time
import weakref
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable

from console.profile import Profile, api_key
from console.host.base import Host
from backend.runs import RunDirError
from backend.runs import check_run_id as _check_run_id
from console.control.units import (UnitNameError, exit_status_path, stage_log_path, stage_start_command,
                                   stage_stop_command, stage_unit_name)

# The upload is the installed `backend` package and nothing else: host code only, never the console or the
# demo's stand-in, and the same files whether the console runs from a wheel or a checkout.
BACKEND_PACKAGE = "backend"
STAGE_MODULES = {"generate": "backend.generate"}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class StageError(Exception):
    pass


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


async def ensure_backend(host: Host, profile: Profile, shown: list[str]) -> str:
    """Make sure the host has this backend; return the directory to put on PYTHONPATH."""
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


def generate_argv(profile: Profile, run_id: str, *, dataset: str | None = None, limit: int | None = None,
                  fresh: bool = False, preflight_only: bool = False, api_key_path: str | None = None) -> list[str]:
    g = profile.generate
    dataset = dataset or g.dataset
    if not dataset:
        raise StageError("no dataset: set [generate].dataset in the profile or pass --dataset PATH")
    argv = [profile.paths.python, "-m", STAGE_MODULES["generate"],
            "--dataset", dataset, "--work-dir", profile.paths.work_dir, "--run-id", run_id,
            "--endpoint", f"http://127.0.0.1:{profile.server.port}", "--model", profile.server.model_id,
            "--max-tokens", str(g.max_tokens), "--long-prompt", g.long_prompt, "--concurrency", str(g.concurrency),
            "--request-timeout", f"{g.request_timeout_s:g}", "--temperature", f"{g.temperature:g}",
            "--top-p", f"{g.top_p:g}", "--return-token-ids", g.return_token_ids,
            "--max-retries", str(g.max_retries), "--limit", str(limit or g.samples),
            "--expect-reasoning" if profile.server.expect_reasoning else "--no-expect-reasoning"]
    if g.chat_template_kwargs:
        argv += ["--chat-template-kwargs", json.dumps(g.chat_template_kwargs, separators=(",", ":"))]
    if api_key_path:
        argv += ["--api-key-file", api_key_path]
    if fresh:
        argv.append("--fresh")
    if preflight_only:
        argv.append("--preflight-only")
    return argv


async def upload_api_key(host: Host, profile: Profile) -> str | None:
    """The stage runs detached, where the console's environment does not reach: hand it the API key as
    a 0600 file in a 0700 dir on the host, so it is in no command line, unit property or log."""
    key = api_key(profile)
    if not key:
        return None
    secrets_dir = f"{profile.paths.work_dir}/secrets"
    await host.run(["sh", "-c", 'umask 077 && mkdir -p "$1" && chmod 700 "$1"', "sh", secrets_dir],
                   timeout=30, check=True)
    path = f"{secrets_dir}/vllm-api-key"
    await host.upload(key.encode() + b"\n", path, mode=0o600)
    return path


def run_dir_path(profile: Profile, run_id: str) -> str:
    return f"{profile.paths.work_dir}/runs/{run_id}"


async def launch_generate(host: Host, profile: Profile, *, run_id: str | None = None, dataset: str | None = None,
                          limit: int | None = None, fresh: bool = False) -> Launch:
    run_id = check_run_id(run_id or new_run_id("generate"))
    dataset = await resolve_dataset(host, profile, dataset)
    shown: list[str] = []
    code_dir = await ensure_backend(host, profile, shown)
    env = {"PYTHONPATH": code_dir, "PYTHONUNBUFFERED": "1"}
    key_path = await upload_api_key(host, profile)
    preflight = generate_argv(profile, run_id, dataset=dataset, limit=limit, fresh=fresh, preflight_only=True,
                              api_key_path=key_path)
    pre_cmd = ["env", *(f"{k}={v}" for k, v in env.items()), *preflight]
    shown.append(shlex.join(pre_cmd))
    res = await host.run(pre_cmd, timeout=300)
    if not res.ok:
        raise StageError("preflight failed:\n" + _preflight_text(res.stdout, res.stderr))
    unit = stage_unit_name("generate", run_id)
    run_dir = run_dir_path(profile, run_id)
    argv = generate_argv(profile, run_id, dataset=dataset, limit=limit, fresh=fresh, api_key_path=key_path)
    no_expand = profile.server.manager == "systemd" and await systemd_run_expands(host)
    try:
        start = stage_start_command(profile, unit, argv, log_path=stage_log_path(profile, unit),
                                    cwd=profile.paths.work_dir, env=env, no_expand_option=no_expand)
    except UnitNameError as exc:
        raise StageError(str(exc)) from None
    shown.append(start.shown)
    res = await host.run(start.argv, timeout=60)
    if not res.ok:
        raise StageError(f"starting {unit} failed (exit {res.returncode}): {(res.stderr or res.stdout).strip()}")
    return Launch(run_id=run_id, unit=unit, run_dir=run_dir, commands=shown)


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
        res = await host.run(["tmux", "list-panes", "-t", f"={unit}", "-F", "#{pane_dead}"], timeout=30)
        if res.ok and "0" in res.stdout.split():
            return None
        path = stage_log_path(profile, unit)
        status = await host.run(["cat", exit_status_path(path)], timeout=30)
        how = f"exit status {status.stdout.strip() or '?'}"
        log = await host.run(["tail", "-n", "20", path], timeout=30)
    # host text on the operator's terminal: no escape sequences (OSC 52 writes the clipboard)
    tail = "\n".join(_CONTROL.sub("?", line) for line in log.stdout.strip().splitlines()[-20:])
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


# The stage programs the console can start, by stage name.
LAUNCHERS = {"generate": launch_generate}

