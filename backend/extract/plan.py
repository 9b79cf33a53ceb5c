"""The swap plan: how the extract stage takes the GPUs from the baseline server and gives them back.

The console builds it from the profile (console/control/extraction.py) and hands it over as a JSON file;
the stage runs it itself, detached on the host, so a lost console never strands the GPUs. Every command
is an argv list (no shell parsing here), run with a timeout:

    stop_baseline, start_extractor        before extraction
    stop_extractor, start_baseline        after it, ALSO after a failure or SIGTERM
    extractor_alive (optional)            exits 0 while the extraction server's unit/session runs
    extractor_log_tail (optional)         prints the end of its log, for saying why it died

plus where the extractor answers (`endpoint`, `health_url`, `models_url`), how long it may take to load
(`ready_timeout_s`), where its connector writes (`storage_path`), the layer ids the server is started with
(`extract_layer_ids`: the aux ids plus the verifier's final layer, backend/verifier.extraction_layer_ids) and
the aux ids alone (`aux_layer_ids`, what training and verify get).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from backend.numbers import finite
from backend.runs import read_json_object

PLAN_VERSION = 1
TIMEOUT_MAX_S = 86400.0  # the profile's timeouts go to a day at most (console/profile.py)
STEPS = ("stop_baseline", "start_extractor", "stop_extractor", "start_baseline")


class PlanError(ValueError):
    """The plan file is unusable; the message names the file and the key."""


@dataclass(frozen=True)
class SwapPlan:
    stop_baseline: list[str]
    start_extractor: list[str]
    stop_extractor: list[str]
    start_baseline: list[str]
    endpoint: str
    health_url: str
    models_url: str
    ready_timeout_s: float
    storage_path: str
    aux_layer_ids: list[int]
    extract_layer_ids: list[int]  # asked of the server: aux ids + the final layer; one state per id comes back
    command_timeout_s: float = 300.0
    extractor_alive: list[str] | None = None
    extractor_log_tail: list[str] | None = None
    baseline_unit: str = ""
    extractor_unit: str = ""
    extractor_command: list[str] = field(default_factory=list)  # shown to the operator

    def to_dict(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, **asdict(self)}


def _argv(path: str, data: dict[str, Any], key: str, *, required: bool) -> list[str] | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise PlanError(f"{path}: {key} must be a non-empty list of strings (an argv), got {str(value)[:80]}")
    return list(value)


def _url(path: str, data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise PlanError(f"{path}: {key} must be an http(s) URL, got {value!r}")
    return value.rstrip("/")


def plan_from_dict(data: Any, path: str = "<plan>") -> SwapPlan:
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a JSON object")
    if data.get("version") != PLAN_VERSION:
        raise PlanError(f"{path}: version {data.get('version')!r} is not {PLAN_VERSION}: the console and the "
                        f"backend on the host differ; start the stage from the console again")
    ids = data.get("aux_layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise PlanError(f"{path}: aux_layer_ids must be a non-empty list of integers")
    asked = data.get("extract_layer_ids")
    if not isinstance(asked, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in asked):
        raise PlanError(f"{path}: extract_layer_ids must be a list of integers (the aux ids plus the final layer), "
                        f"got {str(asked)[:80]}: the console and the backend on the host differ; start the stage "
                        f"from the console again")
    if asked[:-1] != ids or len(asked) != len(ids) + 1:
        raise PlanError(f"{path}: extract_layer_ids {asked} must be aux_layer_ids {ids} plus the final layer")
    timeouts = {}
    for key, default in (("ready_timeout_s", None), ("command_timeout_s", 300.0)):
        value = data.get(key, default)
        if finite(value) is None or not 0 < value <= TIMEOUT_MAX_S:
            raise PlanError(f"{path}: {key} must be a positive number of seconds (finite, at most "
                            f"{TIMEOUT_MAX_S:g}), got {value!r}")
        timeouts[key] = float(value)
    storage = data.get("storage_path")
    if not isinstance(storage, str) or not storage.startswith("/"):
        raise PlanError(f"{path}: storage_path must be an absolute directory path, got {storage!r}")
    endpoint = _url(path, data, "endpoint")
    return SwapPlan(
        stop_baseline=_argv(path, data, "stop_baseline", required=True),
        start_extractor=_argv(path, data, "start_extractor", required=True),
        stop_extractor=_argv(path, data, "stop_extractor", required=True),
        start_baseline=_argv(path, data, "start_baseline", required=True),
        endpoint=endpoint,
        health_url=_url(path, {"health_url": data.get("health_url", f"{endpoint}/health")}, "health_url"),
        models_url=_url(path, {"models_url": data.get("models_url", f"{endpoint}/v1/models")}, "models_url"),
        ready_timeout_s=timeouts["ready_timeout_s"], command_timeout_s=timeouts["command_timeout_s"],
        storage_path=storage, aux_layer_ids=list(ids), extract_layer_ids=list(asked),
        extractor_alive=_argv(path, data, "extractor_alive", required=False),
        extractor_log_tail=_argv(path, data, "extractor_log_tail", required=False),
        baseline_unit=str(data.get("baseline_unit") or ""), extractor_unit=str(data.get("extractor_unit") or ""),
        extractor_command=[str(v) for v in data.get("extractor_command") or []])


def check_server_layers(plan: SwapPlan, info: Any) -> None:
    """PlanError unless the plan's server is asked for what speculators reads: the aux ids and then the
    verifier's (`info`: backend.verifier.VerifierInfo) final layer, one state each."""
    from backend.verifier import VerifierError, check_extraction_layer_ids, extraction_layer_ids

    try:
        check_extraction_layer_ids(info, plan.extract_layer_ids)
    except VerifierError as exc:
        raise PlanError(f"the plan starts the extraction server with layer ids {plan.extract_layer_ids}, expected "
                        f"{extraction_layer_ids(plan.aux_layer_ids, info.num_layers)}: {exc}") from None


def load_plan(path: str) -> SwapPlan:
    return plan_from_dict(read_json_object(path, PlanError, f"--plan {path}: no such file"), path)
