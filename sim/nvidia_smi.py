"""An `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` stand-in over the simulated GPUs.

`--query-compute-apps=gpu_uuid,pid,process_name,used_memory` lists the simulated server's process on
every GPU it holds memory on (none once it exited): the GPU table the telemetry reads is the one a
stage's GPU check reads, so a server that holds every GPU is seen there as on a real host.

`python -m sim.nvidia_smi --state FILE --query-gpu=index,name,memory.used ...` prints rows the
way the real tool does (columns in the order queried, ", " separated, `[N/A]` for unknown values).
`--simulate-no-driver` (or EAGLE3_SIM_NO_DRIVER=1) prints the real "couldn't communicate with the
NVIDIA driver" message and exits 9, as nvidia-smi does on a host whose driver is gone.
Knobs for the host-integrity and smoke checks: EAGLE3_SIM_DRIVER_VERSION (the driver_version it reports,
e.g. an old 525.60.13) and EAGLE3_SIM_CLOCK_REASONS (a hex mask every GPU reports as
clocks_throttle_reasons.active / clocks_event_reasons.active, e.g. 0x20 for a thermal slowdown; default:
GPU idle (0x1) on an idle GPU, none (0x0) on a busy one).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from sim.gpu_state import IDLE_USED_MIB, STATE_ENV, SimGpu, read_state

NO_DRIVER_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
NO_DRIVER_EXIT = 9
BAD_ARGS_EXIT = 2
DRIVER_VERSION = "570.133.20"
DRIVER_ENV = "EAGLE3_SIM_DRIVER_VERSION"
CLOCK_REASONS_ENV = "EAGLE3_SIM_CLOCK_REASONS"


def _driver(_g: SimGpu) -> str:
    return os.environ.get(DRIVER_ENV) or DRIVER_VERSION


def _clock_reasons(g: SimGpu) -> str:
    """nvidia-smi prints the mask as 0x and 16 hex digits."""
    forced = os.environ.get(CLOCK_REASONS_ENV)
    try:
        mask = int(forced, 16) if forced else (0x1 if not g.utilization_pct else 0x0)
    except ValueError:
        mask = 0x0
    return f"0x{mask:016x}"

Getter = Callable[[SimGpu], "str | int | float | None"]
# field -> (header, unit, value)
FIELDS: dict[str, tuple[str, str | None, Getter]] = {
    "index": ("index", None, lambda g: g.index),
    "name": ("name", None, lambda g: g.name),
    "gpu_name": ("name", None, lambda g: g.name),
    "uuid": ("uuid", None, lambda g: f"GPU-5a1d0000-0000-4000-8000-{g.index:012x}"),
    "gpu_uuid": ("uuid", None, lambda g: f"GPU-5a1d0000-0000-4000-8000-{g.index:012x}"),
    "pci.bus_id": ("pci.bus_id", None, lambda g: f"00000000:{0x18 + 0x10 * g.index:02X}:00.0"),
    "driver_version": ("driver_version", None, _driver),
    "clocks_throttle_reasons.active": ("clocks_throttle_reasons.active", None, _clock_reasons),
    "clocks_event_reasons.active": ("clocks_event_reasons.active", None, _clock_reasons),
    "memory.used": ("memory.used", "MiB", lambda g: g.memory_used_mib),
    "memory.total": ("memory.total", "MiB", lambda g: g.memory_total_mib),
    "memory.free": ("memory.free", "MiB", lambda g: g.memory_total_mib - g.memory_used_mib),
    "utilization.gpu": ("utilization.gpu", "%", lambda g: g.utilization_pct),
    "utilization.memory": ("utilization.memory", "%", lambda g: None),
    "temperature.gpu": ("temperature.gpu", None, lambda g: g.temperature_c),
    "power.draw": ("power.draw", "W", lambda g: g.power_w),
    "power.limit": ("power.limit", "W", lambda g: 700.0),
    "fan.speed": ("fan.speed", "%", lambda g: None),  # SXM boards have no fan: nvidia-smi says [N/A]
}


# nvidia-smi's compute-apps fields (and the aliases it accepts) -> (header, unit)
APP_FIELDS: dict[str, tuple[str, str | None]] = {
    "gpu_uuid": ("gpu_uuid", None), "pid": ("pid", None), "process_name": ("process_name", None),
    "name": ("process_name", None), "used_memory": ("used_gpu_memory", "MiB"),
    "used_gpu_memory": ("used_gpu_memory", "MiB"), "gpu_name": ("gpu_name", None),
}


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            first = fh.read(4096).split(b"\0", 1)[0].decode(errors="replace")
        return first or "[Not Found]"
    except OSError:
        return "[Not Found]"


def render_apps(gpus: list[SimGpu], pid: int | None, fields: list[str], *, header: bool, units: bool) -> str:
    """One row per GPU the server process holds memory on."""
    lines = []
    if header:
        lines.append(", ".join(f"{APP_FIELDS[f][0]} [{APP_FIELDS[f][1]}]" if APP_FIELDS[f][1] else APP_FIELDS[f][0]
                               for f in fields))
    if pid is not None:
        name = _process_name(pid)
        for gpu in gpus:
            if gpu.memory_used_mib <= IDLE_USED_MIB:
                continue
            values = {"gpu_uuid": FIELDS["uuid"][2](gpu), "pid": pid, "process_name": name, "name": name,
                      "used_memory": gpu.memory_used_mib, "used_gpu_memory": gpu.memory_used_mib,
                      "gpu_name": gpu.name}
            lines.append(", ".join(_cell(values[f], APP_FIELDS[f][1], units) for f in fields))
    return "".join(line + "\n" for line in lines)


def _cell(value: str | int | float | None, unit: str | None, with_units: bool) -> str:
    if value is None:
        return "[N/A]"
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{text} {unit}" if with_units and unit else text


def render(gpus: list[SimGpu], fields: list[str], *, header: bool, units: bool) -> str:
    lines = []
    if header:
        lines.append(", ".join(f"{FIELDS[f][0]} [{FIELDS[f][1]}]" if FIELDS[f][1] else FIELDS[f][0]
                               for f in fields))
    for gpu in gpus:
        lines.append(", ".join(_cell(FIELDS[f][2](gpu), FIELDS[f][1], units) for f in fields))
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi", description=__doc__.splitlines()[0])
    parser.add_argument("--state", default=os.environ.get(STATE_ENV), help=f"GPU state file (env {STATE_ENV})")
    parser.add_argument("--query-gpu", dest="query")
    parser.add_argument("--query-compute-apps", dest="apps")
    parser.add_argument("--format", dest="fmt")
    parser.add_argument("-i", "--id", dest="ids", help="comma-separated GPU indexes")
    parser.add_argument("--simulate-no-driver", action="store_true")
    args = parser.parse_args(argv)

    if args.simulate_no_driver or os.environ.get("EAGLE3_SIM_NO_DRIVER") == "1":
        sys.stdout.write(NO_DRIVER_MESSAGE)
        return NO_DRIVER_EXIT
    if not args.query and not args.apps:
        sys.stderr.write("This stand-in only implements --query-gpu=FIELD,... or --query-compute-apps=FIELD,... "
                         "--format=csv[,noheader][,nounits]\n")
        return BAD_ARGS_EXIT
    known = APP_FIELDS if args.apps else FIELDS
    fields = [f.strip() for f in (args.apps or args.query).split(",") if f.strip()]
    for name in fields:
        if name not in known:
            sys.stdout.write(f'Field "{name}" is not a valid field to query.\n\n')
            return BAD_ARGS_EXIT
    opts = [o.strip() for o in (args.fmt or "").split(",") if o.strip()]
    if "csv" not in opts or any(o not in ("csv", "noheader", "nounits") for o in opts):
        sys.stdout.write(f'"{args.fmt}" is not a valid format. Use --format=csv[,noheader][,nounits].\n')
        return BAD_ARGS_EXIT
    try:
        state = read_state(args.state)
    except ValueError as exc:
        sys.stderr.write(f"nvidia-smi (simulated): {exc}\n")
        return 1
    gpus = state.gpus
    if args.ids:
        try:
            wanted = {int(i) for i in args.ids.split(",")}
        except ValueError:
            sys.stdout.write(f"Invalid combination of input arguments: -i {args.ids}\n")
            return BAD_ARGS_EXIT
        gpus = [g for g in gpus if g.index in wanted]
        if not gpus:
            sys.stdout.write("No devices were found\n")
            return 6
    if args.apps:
        sys.stdout.write(render_apps(gpus, state.pid, fields, header="noheader" not in opts, units="nounits" not in opts))
        return 0
    sys.stdout.write(render(gpus, fields, header="noheader" not in opts, units="nounits" not in opts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
