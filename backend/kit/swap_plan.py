"""The swap plan: how the extract stage (and online train and verify) take the GPUs from the baseline.

The console builds it from the profile (console/control/extraction.py) and hands it over as a JSON file;
the stage runs it itself, detached on the host, so a lost console never strands the GPUs. It is the one
server switch's plan (backend/kit/switch.py: SwitchPlan, the baseline home and the extraction server, named
`extractor`, away: steps stop_baseline, start_extractor, then stop_extractor, start_baseline ALSO after
a failure or SIGTERM) plus where the extraction server's connector writes (`storage_path`), the layer ids
the server is started with (`extract_layer_ids`: the aux ids plus the verifier's final layer,
backend/kit/verifier.extraction_layer_ids) and the aux ids alone (`aux_layer_ids`, what training and verify get).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backend.contract.plans import PlanError, read_plan
from backend.kit.switch import ServerSpec, SwitchPlan, SwitchPlanError, switch_from_dict

PLAN_VERSION = 2
EXTRACTOR = "extractor"  # the extraction server's name in the switch: steps stop_extractor, start_extractor


@dataclass(frozen=True)
class SwapPlan:
    """The switch (the baseline home, the extraction server away) and what the extraction needs of it."""
    switch: SwitchPlan
    storage_path: str
    aux_layer_ids: list[int]
    extract_layer_ids: list[int]  # asked of the server: aux ids + the final layer; one state per id comes back

    @property
    def extractor(self) -> ServerSpec:
        return self.switch.server(EXTRACTOR)

    @property
    def endpoint(self) -> str:
        return self.switch.endpoint

    @property
    def health_url(self) -> str:
        return self.switch.health_url

    @property
    def models_url(self) -> str:
        return self.switch.models_url

    @property
    def extractor_unit(self) -> str:
        return self.extractor.unit

    @property
    def baseline_unit(self) -> str:
        return self.switch.home.unit

    def to_dict(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, "switch": self.switch.to_dict(), "storage_path": self.storage_path,
                "aux_layer_ids": list(self.aux_layer_ids), "extract_layer_ids": list(self.extract_layer_ids)}


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
    storage = data.get("storage_path")
    if not isinstance(storage, str) or not storage.startswith("/"):
        raise PlanError(f"{path}: storage_path must be an absolute directory path, got {storage!r}")
    try:
        switch = switch_from_dict(data.get("switch"), path)
        switch.server(EXTRACTOR)
    except SwitchPlanError as exc:
        raise PlanError(str(exc)) from None
    except KeyError:
        raise PlanError(f"{path}: the switch has no {EXTRACTOR!r} server") from None
    return SwapPlan(switch=switch, storage_path=storage, aux_layer_ids=list(ids), extract_layer_ids=list(asked))


def check_server_layers(plan: SwapPlan, info: Any) -> None:
    """PlanError unless the plan's server is asked for what speculators reads: the aux ids and then the
    verifier's (`info`: backend.kit.verifier.VerifierInfo) final layer, one state each."""
    from backend.kit.verifier import VerifierError, check_extraction_layer_ids, extraction_layer_ids

    try:
        check_extraction_layer_ids(info, plan.extract_layer_ids)
    except VerifierError as exc:
        raise PlanError(f"the plan starts the extraction server with layer ids {plan.extract_layer_ids}, expected "
                        f"{extraction_layer_ids(plan.aux_layer_ids, info.num_layers)}: {exc}") from None


def load_plan(path: str) -> SwapPlan:
    return plan_from_dict(read_plan(path), path)
