"""The extraction swap, built from the profile: the plan the extract stage runs on the host, and its argv.

The extraction server is the baseline's own program (units.ServerProgram: the operator's unit's command
line, environment, user and working directory as systemd runs it; tmux: the profile's command) plus vLLM's
two extraction flags: the `extract_hidden_states` speculative method with the aux layer ids AND the
verifier's final layer (vLLM writes exactly one state per id; speculators reads the last one as the final
state: backend/kit/verifier.extraction_layer_ids), and the hidden-states KV connector writing into this run's
staging directory. It runs as its own
program beside the baseline's name (`<server unit>-extract`): a transient systemd unit, or its own tmux
session (units.derived_server_start_argv, stopped like a stage).

The plan (backend/kit/swap_plan.py reads it: the one server switch's plan, switch_plan.py) holds argv lists
only; the extract stage runs it itself, detached on the host, in order: stop the baseline (seen down),
start the extractor, extract, then stop the extractor and start the baseline, the last two also after a
failure or SIGTERM. Pure functions, no I/O.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from backend.kit.redact import shown
from backend.kit.swap_plan import EXTRACTOR, SwapPlan
from backend.kit.verifier import extraction_layer_ids
from console.control.switch_plan import derived_server, switch_plan
from console.control.units import (ServerProgram, derived_server_start_argv, profile_program, stage_log_path,
                                   stage_stop_argv, tmux_stop_argv)
from console.profile import Profile

EXTRACT_METHOD = "extract_hidden_states"
HS_CONNECTOR = "ExampleHiddenStatesConnector"
# the flags the extraction adds; a baseline command line that already has one cannot be extended
_OWN_FLAGS = ("--speculative-config", "--speculative_config", "--kv-transfer-config", "--kv_transfer_config")


class ExtractionPlanError(ValueError):
    """The profile cannot give an extraction server; the message says which value and why."""


def extractor_unit(profile: Profile) -> str:
    return f"{profile.server.unit}-extract"


def staging_dir(profile: Profile, run_id: str) -> str:
    """Where the extraction server's connector writes before the stage moves each file into the run."""
    return f"{profile.paths.work_dir}/extract-staging/{run_id}"


def plan_path(profile: Profile, run_id: str) -> str:
    """Where the console puts the plan on the host (beside the runs, not inside the stage's own dir)."""
    return f"{profile.paths.work_dir}/plans/{run_id}.extract.json"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def extraction_flags(layer_ids: Sequence[int], storage: str, connector: str = HS_CONNECTOR,
                     connector_module: str | None = None) -> list[str]:
    """vLLM's flags for an extraction server writing one state per id in `layer_ids` into `storage`, through
    `connector` (vLLM's registry's, or imported from `connector_module`: the profile's [extract] values)."""
    spec = {"method": EXTRACT_METHOD, "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [int(i) for i in layer_ids]}}}
    kv: dict[str, Any] = {"kv_connector": connector, "kv_role": "kv_producer",
                          "kv_connector_extra_config": {"shared_storage_path": storage}}
    if connector_module:
        kv["kv_connector_module_path"] = connector_module
    return ["--speculative-config", _json(spec), "--kv-transfer-config", _json(kv)]


def profile_extraction_flags(profile: Profile, layer_ids: Sequence[int], storage: str) -> list[str]:
    return extraction_flags(layer_ids, storage, profile.extract.connector, profile.extract.connector_module)


def _checked_base(profile: Profile, aux_layer_ids: Sequence[int], program: ServerProgram | None) -> ServerProgram:
    if not aux_layer_ids:
        raise ExtractionPlanError("no aux layer ids: resolve [drafter].aux_layer_ids against the verifier first")
    program = program or profile_program(profile)
    clash = sorted({a.split("=", 1)[0] for a in program.argv if a.split("=", 1)[0] in _OWN_FLAGS})
    if clash:
        where = program.source if program.source != "the profile" else "server.vllm_args or server.command"
        raise ExtractionPlanError(f"the server's command line already has {', '.join(clash)} ({where}): the "
                                  f"extraction server adds its own; take it out of the baseline's arguments")
    return program


def extractor_command(profile: Profile, layer_ids: Sequence[int], storage: str,
                      program: ServerProgram | None = None) -> list[str]:
    """`layer_ids`: what the server is asked for (the aux ids and the final layer); `program`: the baseline's
    (operator_unit.read_server_program); default the profile's command."""
    base = _checked_base(profile, layer_ids, program)
    return [*base.argv, *profile_extraction_flags(profile, layer_ids, storage)]


def build_plan(profile: Profile, run_id: str, aux_layer_ids: Sequence[int], num_layers: int,
               program: ServerProgram | None = None) -> dict[str, Any]:
    """The swap plan for extract run `run_id` (JSON-ready; backend.kit.swap_plan.plan_from_dict reads it):
    the one server switch with the extraction server away from the baseline.
    `num_layers`: the verifier's decoder layers, whose last output the server is asked for too (vLLM writes
    one state per listed id; speculators reads the last as the final state: backend/kit/verifier);
    `program`: the baseline's (operator_unit.read_server_program); default the profile's command."""
    s = profile.server
    unit = extractor_unit(profile)
    storage = staging_dir(profile, run_id)
    base = _checked_base(profile, aux_layer_ids, program)
    asked = extraction_layer_ids(aux_layer_ids, num_layers)
    flags = profile_extraction_flags(profile, asked, storage)
    start = derived_server_start_argv(profile, unit, base, flags, log_path=stage_log_path(profile, unit),
                                      env=dict(profile.extract.server_env), stop_timeout_s=s.stop_timeout_s)
    stop = stage_stop_argv(profile, unit) if s.manager == "systemd" else tmux_stop_argv(unit, s.stop_timeout_s)
    extractor = derived_server(profile, EXTRACTOR, unit, start, stop, [*base.argv, *flags])
    switch = switch_plan(profile, [extractor], ready_timeout_s=profile.extract.ready_timeout_s or s.load_timeout_s)
    return SwapPlan(switch=switch, storage_path=storage, aux_layer_ids=[int(i) for i in aux_layer_ids],
                    extract_layer_ids=asked).to_dict()


def describe_plan(plan: dict[str, Any]) -> list[str]:
    """The plan's commands as the operator confirms them, in the order they run."""
    switch = plan["switch"]
    home, away = switch["home"], switch["away"][0]
    steps = [(f"stop_{home['name']}", home["stop"]), (f"start_{away['name']}", away["start"]),
             (f"stop_{away['name']}", away["stop"]), (f"start_{home['name']}", home["start"])]
    return [f"{step}: {shown(argv)}" for step, argv in steps]
