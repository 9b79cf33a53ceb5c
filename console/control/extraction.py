"""The extraction swap, built from the profile: the plan the extract stage runs on the host, and its argv.

The extraction server is the baseline's own program (units.ServerProgram: the operator's unit's command
line, environment, user and working directory as systemd runs it; tmux: the profile's command) plus vLLM's
two extraction flags: the `extract_hidden_states` speculative method with the aux layer ids AND the
verifier's final layer (vLLM writes exactly one state per id; speculators reads the last one as the final
state: backend/verifier.extraction_layer_ids), and the hidden-states KV connector writing into this run's
staging directory. It runs as its own
program beside the baseline's name (`<server unit>-extract`): a transient systemd unit, or its own tmux
session (units.derived_server_start_argv, stopped like a stage).

The plan (backend/extract/plan.py reads it) holds argv lists only; the extract stage runs them itself,
detached on the host, in order: stop the baseline, start the extractor, extract, then stop the extractor
and start the baseline, the last two also after a failure or SIGTERM. Pure functions, no I/O.
"""
from __future__ import annotations

import json
import shlex
from typing import Any, Sequence

from backend.extract.plan import PLAN_VERSION
from backend.redact import redacted
from backend.verifier import extraction_layer_ids
from console.control.units import (ServerProgram, _sudo, derived_server_start_argv, profile_program,
                                   server_log_path, server_start_argv, server_stop_argv, stage_log_path,
                                   stage_stop_argv, tmux_stop_argv, tmux_target)
from console.profile import Profile

EXTRACT_METHOD = "extract_hidden_states"
HS_CONNECTOR = "ExampleHiddenStatesConnector"
# the flags the extraction adds; a baseline command line that already has one cannot be extended
_OWN_FLAGS = ("--speculative-config", "--speculative_config", "--kv-transfer-config", "--kv_transfer_config")
LOG_LINES = 40


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


def extraction_flags(layer_ids: Sequence[int], storage: str) -> list[str]:
    """vLLM's flags for an extraction server writing one state per id in `layer_ids` into `storage`."""
    spec = {"method": EXTRACT_METHOD, "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [int(i) for i in layer_ids]}}}
    kv = {"kv_connector": HS_CONNECTOR, "kv_role": "kv_producer",
          "kv_connector_extra_config": {"shared_storage_path": storage}}
    return ["--speculative-config", _json(spec), "--kv-transfer-config", _json(kv)]


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
    return [*base.argv, *extraction_flags(layer_ids, storage)]


def _alive_argv(profile: Profile, unit: str) -> list[str]:
    if profile.server.manager == "systemd":
        return ["systemctl", "is-active", "--quiet", unit]
    # tmux: the pane's program is the server; remain-on-exit keeps a dead pane, so ask whether it is dead
    script = '[ "$(tmux list-panes -t "$1" -F "#{pane_dead}" 2>/dev/null | head -n 1)" = 0 ]'
    return ["sh", "-c", script, "sh", tmux_target(unit)]


def _log_tail_argv(profile: Profile, unit: str, log_path: str) -> list[str]:
    if profile.server.manager == "systemd":
        return _sudo(profile, ["journalctl", "-u", unit, "-n", str(LOG_LINES), "--no-pager", "-o", "cat"])
    return ["tail", "-n", str(LOG_LINES), log_path]


def build_plan(profile: Profile, run_id: str, aux_layer_ids: Sequence[int], num_layers: int,
               program: ServerProgram | None = None) -> dict[str, Any]:
    """The swap plan for extract run `run_id` (JSON-ready; backend.extract.plan.plan_from_dict reads it).
    `num_layers`: the verifier's decoder layers, whose last output the server is asked for too;
    `program`: the baseline's (operator_unit.read_server_program); default the profile's command."""
    s = profile.server
    unit = extractor_unit(profile)
    storage = staging_dir(profile, run_id)
    base = _checked_base(profile, aux_layer_ids, program)
    asked = extraction_layer_ids(aux_layer_ids, num_layers)
    flags = extraction_flags(asked, storage)
    command = [*base.argv, *flags]
    log_path = stage_log_path(profile, unit)
    start = derived_server_start_argv(profile, unit, base, flags, log_path=log_path,
                                      env=dict(profile.extract.server_env), stop_timeout_s=s.stop_timeout_s)
    stop = stage_stop_argv(profile, unit) if s.manager == "systemd" else tmux_stop_argv(unit, s.stop_timeout_s)
    endpoint = f"http://127.0.0.1:{s.port}"
    return {
        "version": PLAN_VERSION,
        "baseline_unit": s.unit,
        "extractor_unit": unit,
        "extractor_command": command,
        "stop_baseline": server_stop_argv(profile),
        "start_extractor": start,
        "stop_extractor": stop,
        "start_baseline": server_start_argv(profile, server_log_path(profile)),
        "extractor_alive": _alive_argv(profile, unit),
        "extractor_log_tail": _log_tail_argv(profile, unit, log_path),
        "endpoint": endpoint,
        "health_url": f"{endpoint}/health",
        "models_url": f"{endpoint}/v1/models",
        "ready_timeout_s": profile.extract.ready_timeout_s or s.load_timeout_s,
        "command_timeout_s": s.stop_timeout_s + 60,
        "storage_path": storage,
        "aux_layer_ids": [int(i) for i in aux_layer_ids],
        "extract_layer_ids": asked,
    }


def describe_plan(plan: dict[str, Any]) -> list[str]:
    """The plan's commands as the operator confirms them, in the order they run."""
    return [f"{step}: {shlex.join(redacted(plan[step]))}" for step in
            ("stop_baseline", "start_extractor", "stop_extractor", "start_baseline")]
