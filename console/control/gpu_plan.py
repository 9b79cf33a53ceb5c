"""The GPU plan of what the operator asked for, from the profile: the host's shape (how many GPUs, the
baseline's, the trainer's) handed to backend/kit/gpu_owners.py, which decides who holds which GPUs at each
step, what must stop first, whether a pipeline keeps the baseline down across its stages, and how many
server loads it costs. Pure functions, no I/O."""
from __future__ import annotations

from backend.kit.gpu_owners import GpuPlan, HostShape, OwnershipError, plan_gpus, server_gpus_of
from console.control.server_argv import ServerArgvError, server_command, target_tp
from console.profile import Profile


def server_gpus(profile: Profile) -> tuple[int, ...]:
    """The baseline's GPUs: the first tensor-parallel-size of them (vLLM's own placement)."""
    try:
        tp = target_tp(server_command(profile))
    except ServerArgvError:
        return server_gpus_of(1)
    return server_gpus_of(tp, host_gpus=profile.gpus.count)  # OwnershipError names the range


def trainer_gpus(profile: Profile, host_gpus: int) -> tuple[int, ...]:
    """[train] gpus: a list names the GPUs by index; a count N is GPUs 0..N-1 (at most the host's; 0: the
    CPU); unset: every GPU."""
    gpus = profile.train.gpus
    if isinstance(gpus, list):
        return tuple(gpus)
    count = host_gpus if gpus is None else gpus
    return tuple(range(min(count, host_gpus)))


def host_shape(profile: Profile) -> HostShape:
    """The host's GPU count is [gpus] count when stated; else what the server and the trainer's indexes
    imply (at least)."""
    server = server_gpus(profile)
    named = profile.train.gpus if isinstance(profile.train.gpus, list) else []
    count = profile.gpus.count or max([len(server), *(i + 1 for i in named)])
    return HostShape(gpus=count, server=server, trainer=trainer_gpus(profile, count))


def gpu_plan(profile: Profile, stages: list[str], *, online: bool, chain: bool) -> GpuPlan:
    """Raises OwnershipError with what to change when the GPUs cannot be shared as asked."""
    return plan_gpus(host_shape(profile), stages, online=online, chain=chain)


__all__ = ["gpu_plan", "host_shape", "server_gpus", "trainer_gpus", "OwnershipError", "GpuPlan"]
