"""A downloaded drafter into speculators format: `speculators convert CKPT --algorithm eagle3 --verifier V`.

A checkpoint whose config.json has `speculators_config` is in speculators format already (vLLM and the
verify stage read it as it is). Anything else is taken for the original EAGLE-3 / SpecForge layout
(`midlayer.*` weights, a llama-style config.json) and converted; the aux layer ids the original config
names (top level or under `eagle_config`) go to the converter, else those the operator gives.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

from backend.contract.runs import read_json_object, write_json_atomic

CONVERT_TIMEOUT_S = 3600.0
LOG_FILE = "convert.log"


class ConvertError(Exception):
    """The checkpoint cannot be converted; the message says why."""


def read_config(ckpt: str) -> dict[str, Any]:
    return read_json_object(os.path.join(ckpt, "config.json"), ConvertError, f"{ckpt} has no config.json")


def is_speculators_format(config: dict[str, Any]) -> bool:
    return isinstance(config.get("speculators_config"), dict)


def original_aux_layer_ids(config: dict[str, Any]) -> list[int] | None:
    """The aux layer ids an original EAGLE-3 config names, if it names them."""
    for holder in (config, config.get("eagle_config")):
        if isinstance(holder, dict):
            ids = holder.get("eagle_aux_hidden_state_layer_ids")
            if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                     for i in ids):
                return list(ids)
    return None


def convert_argv(python: str, src: str, out: str, verifier: str, kwargs: dict[str, Any]) -> list[str]:
    argv = [python, "-m", "speculators", "convert", src, "--algorithm", "eagle3", "--verifier", verifier,
            "--output-path", out]
    if kwargs:
        argv += ["--algorithm-kwargs", json.dumps(kwargs, separators=(",", ":"), sort_keys=True)]
    return argv


def convert(python: str, src: str, out: str, verifier: str, kwargs: dict[str, Any], *,
            log_dir: str, timeout: float = CONVERT_TIMEOUT_S) -> list[str]:
    """Run the converter into `out` (built beside it, then renamed: a half-written checkpoint never has
    the final name). Returns the command line it ran; its output is kept in `<log_dir>/convert.log`."""
    tmp = out + ".converting"
    shutil.rmtree(tmp, ignore_errors=True)
    argv = convert_argv(python, src, tmp, verifier, kwargs)
    log_path = os.path.join(log_dir, LOG_FILE)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # everything it needs is on disk: never a second download
    try:
        with open(log_path, "wb") as log:
            res = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=env,
                                 stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ConvertError(f"speculators convert took longer than {timeout:g} s (its output: {log_path})") from None
    except OSError as exc:
        raise ConvertError(f"cannot run {python} -m speculators: {exc}") from None
    if res.returncode != 0:
        raise ConvertError(f"speculators convert failed (exit {res.returncode}): {_tail(log_path)}")
    try:
        config = read_config(tmp)
    except ConvertError as exc:
        raise ConvertError(f"speculators convert wrote no usable checkpoint: {exc}") from None
    if not is_speculators_format(config):
        raise ConvertError(f"speculators convert wrote {tmp}/config.json without speculators_config")
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.replace(tmp, out)
    return argv


def _tail(path: str, lines: int = 6, limit: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no output)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-limit:] or "(no output)"


SOURCE_FILE = "fetched_from.json"


def record_source(out: str, source: dict[str, Any]) -> None:
    """Where the converted checkpoint came from, beside it (the repo and commit it was converted from)."""
    write_json_atomic(os.path.join(out, SOURCE_FILE), source)


def converted_from(out: str) -> str | None:
    """The commit a converted checkpoint in `out` was made from; None when there is none, or it does not
    say (a resumed run whose branch moved converts again rather than serve the old commit's weights)."""
    if not os.path.isfile(os.path.join(out, "config.json")):
        return None
    try:
        source = read_json_object(os.path.join(out, SOURCE_FILE), ConvertError, "")
    except ConvertError:
        return None
    commit = source.get("commit")
    return commit if isinstance(commit, str) else None
