"""The host's answers to the console's questions, one entry point (the runs and the verifier are on the host,
so the console asks rather than guess from what it has seen):

    python -m backend.ask latest --work-dir W --stage S
        the run a stage takes by default: the latest completed run of S (its id on stdout)
    python -m backend.ask aux-layers --verifier PATH [--ids 1,2,3]
        the aux layer ids a stage will use for this verifier (the given ones checked, or vLLM's default),
        as JSON {"aux_layer_ids", "num_layers", "extract_layer_ids"} (aux + the final layer, what the
        extraction server is asked for): the extraction server's command line needs them
    python -m backend.ask vllm-floor --verifier PATH --url http://127.0.0.1:PORT/version
        the oldest vLLM an extraction server for this verifier runs on, and what the baseline at URL
        reports, as JSON {"floor", "why", "version", "note", "refusal"} (backend/kit/vllm_floor.py): asked
        before the swap stops the baseline; "refusal" (null: none) says why this server cannot extract
    python -m backend.ask integrity [--port P] [--unit U] [--nvidia-smi JSON]
        the host's integrity (backend/kit/hostfacts.py) as a preflight report in JSON: warnings for two vLLM
        installs and a driver older than torch's CUDA build needs; `server_port` fails when a process in a
        systemd service other than U listens on P (a leftover server); exit 0 either way
    python -m backend.ask servable --work-dir W [--run RUN] [--third]
        the verified checkpoint the drafter server may load (backend/kit/servable.py), as JSON
        {"run_id", "stage", "checkpoint", "trained_k", "max_position_embeddings"} (trained_k: the K its
        config.json says it was trained for, null when it does not say; a bench of several K stays within
        it; max_position_embeddings: the context it was built for, backend/drafter/context.py)

An answer that cannot be given (no such run, a verifier that does not fit) is one line on stderr, exit 2
(backend/contract/exitcodes.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from backend.contract import exitcodes, stages as host_stages
from backend.contract.lookup import latest_completed
from backend.contract.runs import RunDirError, read_json_object
from backend.drafter.checks import trained_k as checkpoint_k
from backend.drafter.context import drafter_context
from backend.kit.verifier import VerifierError, extraction_layer_ids, read_verifier, resolve_aux_layers


def latest(a: argparse.Namespace) -> str:
    return latest_completed(a.work_dir, a.stage).run_id


def aux_layers(a: argparse.Namespace) -> str:
    info = read_verifier(a.verifier)
    try:
        ids = [int(i) for i in a.ids.split(",") if i.strip()]
    except ValueError:
        raise VerifierError(f"--ids {a.ids!r}: expected comma-separated integers such as 2,30,58") from None
    aux = resolve_aux_layers(ids, info)
    return json.dumps({"aux_layer_ids": aux, "num_layers": info.num_layers,
                       "extract_layer_ids": extraction_layer_ids(aux, info.num_layers)})


def vllm_floor(a: argparse.Namespace) -> str:
    from backend.kit.vllm_floor import refusal, server_version

    floor = read_verifier(a.verifier).vllm_floor()
    version, note = server_version(a.url)
    return json.dumps({"floor": floor.text, "why": floor.why, "version": version, "note": note,
                       "refusal": refusal(version, floor) if version else None})


def integrity(a: argparse.Namespace) -> str:
    from backend.kit import hostfacts
    from backend.kit.preflight import PreflightReport

    try:
        smi = json.loads(a.nvidia_smi) if a.nvidia_smi else None
    except ValueError:
        smi = None
    report = PreflightReport()
    hostfacts.check_host(report, smi if isinstance(smi, list) and all(isinstance(x, str) for x in smi) else None)
    if a.port:
        # the unit may run or not: only a listener in another systemd service is known to be a leftover
        why = hostfacts.leftover_on_port(a.port, units=[a.unit] if a.unit else None, servers_down=None)
        report.add("server_port", why is None, f"port {a.port}: {why or 'no leftover server listens'}",
                   hostfacts.leftover_message(a.port, why) if why else "")
    return json.dumps(report.to_dict())


def servable(a: argparse.Namespace) -> str:
    from backend.kit.servable import servable as choose, third

    found = third(a.work_dir) if a.third else choose(a.work_dir, a.run)
    if not os.path.isdir(found.checkpoint):
        raise RunDirError(f"the checkpoint {found.checkpoint} of run {found.run_id} is no longer on this host")
    try:
        config = read_json_object(os.path.join(found.checkpoint, "config.json"), ValueError, "")
        trained_k, context = checkpoint_k(config), drafter_context(config)
    except ValueError:
        trained_k = context = None  # a checkpoint the verify run vouched for, whose K it does not say: no bound
    return json.dumps({**asdict(found), "trained_k": trained_k, "max_position_embeddings": context})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m backend.ask", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="question", required=True)
    q = sub.add_parser("latest", help="the latest completed run of a stage")
    q.add_argument("--work-dir", required=True)
    q.add_argument("--stage", required=True, choices=host_stages.pipeline())
    q.set_defaults(answer=latest)
    q = sub.add_parser("aux-layers", help="the aux layer ids a stage will use for a verifier")
    q.add_argument("--verifier", required=True)
    q.add_argument("--ids", default="", help="comma-separated ids; none: vLLM's default")
    q.set_defaults(answer=aux_layers)
    q = sub.add_parser("vllm-floor", help="the oldest vLLM that extracts for a verifier, and the baseline's")
    q.add_argument("--verifier", required=True)
    q.add_argument("--url", required=True, help="the baseline's /version")
    q.set_defaults(answer=vllm_floor)
    q = sub.add_parser("integrity", help="the host's integrity: vLLM installs, driver, a leftover on the port")
    q.add_argument("--port", type=int, default=0)
    q.add_argument("--unit", default="", help="the profile's systemd unit (its own listener is no leftover)")
    q.add_argument("--nvidia-smi", default="", help="how the GPUs are asked, a JSON list")
    q.set_defaults(answer=integrity)
    q = sub.add_parser("servable", help="the verified checkpoint the drafter server may load")
    q.add_argument("--work-dir", required=True)
    q.add_argument("--run", help="a verify run, or a train run a verify run verified (default: the latest verify)")
    q.add_argument("--third", action="store_true", help="the fetched published drafter, verified")
    q.set_defaults(answer=servable)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        print(a.answer(a))
    except (RunDirError, VerifierError) as exc:
        print(str(exc), file=sys.stderr)
        return exitcodes.BAD_INPUT
    return exitcodes.COMPLETED


if __name__ == "__main__":
    raise SystemExit(main())
