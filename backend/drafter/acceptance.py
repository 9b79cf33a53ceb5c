"""Offline acceptance of an EAGLE-3 draft: how many of its k draft tokens the verifier would accept.

Reusable on its own (benchmarks use it): `offline_acceptance(draft, head, samples, k)`.

Definition. For every anchor position i of a held-out sample whose next k tokens are all supervised
(inside the model's answer), the draft proposes k tokens the way speculators trains and vLLM runs it:
step 0 reads the verifier's aux hidden states up to i and the known token after it; step j reads its
own state of step j-1. A proposal is the draft's argmax mapped to the verifier's vocabulary (d2t). The
verifier's choice at each of those positions is the argmax of its own lm_head over its WHOLE vocabulary
(a token the reduced draft vocabulary cannot produce is a rejection, as in vLLM). Greedy chain: draft
token j is accepted only if tokens 0..j-1 were. Reported per anchor: the accepted count (0..k), and from
it the per-position acceptance p_j = P(at least j+1 accepted), the mean accepted tokens sum(p_j) and the
mean acceptance length 1 + sum(p_j) (vLLM's /metrics convention: the verifier's own token counts too).

Inputs are teacher-forced along the held-out text, as in speculators' training metrics: exact for
greedy decoding when the text is the verifier's greedy continuation; with sampled text it measures
agreement with the verifier's argmax along the sampled path.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import torch


@dataclass
class Acceptance:
    k: int
    samples: int = 0
    anchors: int = 0
    histogram: list[int] = field(default_factory=list)  # anchors with 0..k tokens accepted

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.k + 1)

    def add(self, accepted: torch.Tensor) -> None:
        counts = torch.bincount(accepted.to(torch.long), minlength=self.k + 1)
        for n, c in enumerate(counts.tolist()):
            self.histogram[n] += int(c)
        self.anchors += int(accepted.numel())
        self.samples += 1

    @property
    def per_position(self) -> list[float]:
        if not self.anchors:
            return [0.0] * self.k
        return [sum(self.histogram[j + 1:]) / self.anchors for j in range(self.k)]

    @property
    def mean_accepted(self) -> float:
        return sum(self.per_position)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.mean_accepted

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "per_position": [round(p, 4) for p in self.per_position],
                "mean_accepted": round(self.mean_accepted, 4),
                "mean_acceptance_length": round(self.mean_acceptance_length, 4)}


def chain_accepted(proposals: torch.Tensor, targets: torch.Tensor, supervised: torch.Tensor) -> torch.Tensor:
    """Accepted tokens per anchor.

    proposals [k, n]: draft step j's token at anchor i (verifier vocabulary), for target position i + j;
    targets [n]: the verifier's argmax at each position; supervised [n]: whether position i is scored.
    Anchors are the i with i + k - 1 < n and positions i .. i+k-1 all supervised.
    """
    k, n = proposals.shape
    if n < k:
        return torch.zeros(0, dtype=torch.long)
    m = n - k + 1
    ok = torch.ones(m, dtype=torch.bool)
    alive = torch.ones(m, dtype=torch.bool)
    accepted = torch.zeros(m, dtype=torch.long)
    for j in range(k):
        ok &= supervised[j:j + m].to(torch.bool)
        alive &= proposals[j, :m] == targets[j:j + m]
        accepted += alive.to(torch.long)
    return accepted[ok]


class VerifierHead:
    """The verifier's final norm and FULL lm_head: what the verifier's argmax is computed with."""

    def __init__(self, norm: torch.nn.Module, lm_head_weight: torch.Tensor):
        self.norm = norm
        self.weight = lm_head_weight.float()

    @torch.no_grad()
    def argmax(self, last_hidden: torch.Tensor) -> torch.Tensor:
        normed = self.norm(last_hidden.to(self.norm.weight.dtype)).float()
        return (normed @ self.weight.T).argmax(dim=-1)


def to_verifier_vocab(model: Any, draft_ids: torch.Tensor) -> torch.Tensor:
    """Draft-vocabulary ids -> the verifier's (speculators stores target = draft + d2t[draft])."""
    d2t = getattr(model, "d2t", None)
    if not getattr(model, "use_draft_vocab", False) or d2t is None:
        return draft_ids
    return draft_ids + d2t.to(draft_ids.device)[draft_ids]


@torch.no_grad()
def draft_proposals(model: Any, batch: dict[str, torch.Tensor], k: int) -> torch.Tensor:
    """[k, n] proposals for one shifted sample (speculators' shift_batch layout)."""
    n = batch["input_ids"].shape[0]
    dtype = next(model.parameters()).dtype
    tokens = model(hidden_states=batch["hidden_states"].unsqueeze(0).to(dtype),
                   input_ids=batch["input_ids"].unsqueeze(0),
                   document_ids=torch.zeros(1, n, dtype=torch.long, device=batch["input_ids"].device),
                   position_ids=batch["position_ids"].unsqueeze(0), ttt_steps=k)
    return torch.stack([to_verifier_vocab(model, t[0]) for t in tokens])


def shifted(sample: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from speculators.models.eagle3.data import shift_batch

    return shift_batch(sample)


@torch.no_grad()
def offline_acceptance(model: Any, head: VerifierHead, samples: Iterable[dict[str, torch.Tensor]],
                       k: int) -> Acceptance:
    """Acceptance of `model` over `samples` (speculators dataset items: hidden_states, input_ids,
    verifier_last_hidden_states, loss_mask, lengths, position_ids)."""
    model.eval()
    result = Acceptance(k=k)
    for sample in samples:
        batch = shifted(sample)
        if batch["input_ids"].shape[0] < k:
            continue
        proposals = draft_proposals(model, batch, k)
        targets = head.argmax(batch["verifier_last_hidden_states"])
        result.add(chain_accepted(proposals, targets, batch["loss_mask"]))
    return result
