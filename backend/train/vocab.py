"""The draft vocabulary's size, by evidence: the prepare run's token frequencies (speculators'
`token_freq.pt`, {token id: count} over the supervised tokens, speculators/train/vocab_mapping.py
`save_token_frequency_distribution`).

The default is the smallest N whose N most frequent tokens cover `share` of the supervised tokens, raised
to `floor` (a vocabulary fitted too tightly to a small sample misses tokens the served workload uses),
never above the verifier's. A size given explicitly wins; its coverage is reported the same way.
Each draft token costs an lm_head row (hidden_size weights) and a logit per draft step; a token outside
the draft vocabulary can never be proposed, so every occurrence is a rejection.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_SHARE = 0.99
DEFAULT_FLOOR = 32000  # the size of published Kimi-K2.5 EAGLE-3 drafters' draft vocabularies


@dataclass(frozen=True)
class VocabChoice:
    size: int  # the draft vocabulary (== vocab: the verifier's whole vocabulary, no mapping)
    vocab: int  # the verifier's
    coverage: float | None  # share of the supervised tokens the chosen tokens cover (None: no frequencies)
    chosen_by: str  # "coverage" | "given" | "warm start" | "no token frequencies"
    share: float | None = None
    floor: int | None = None
    distinct: int | None = None  # distinct supervised tokens seen

    @property
    def full(self) -> bool:
        return self.size >= self.vocab

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        cover = f", covering {self.coverage:.2%} of the supervised tokens" if self.coverage is not None else ""
        if self.chosen_by == "coverage":
            how = f"the smallest that covers {self.share or 0:.2%} (floor {self.floor})"
        else:
            how = {"given": "as given", "warm start": "the warm-start checkpoint's",
                   "no token frequencies": "the verifier's whole vocabulary: no token frequencies"}.get(
                self.chosen_by, self.chosen_by)
        return f"draft vocabulary {self.size} of {self.vocab} tokens ({how}{cover})"


def counts(freq: Any) -> list[int]:
    """The counts of a token_freq mapping, most frequent first (ids outside range are the caller's concern)."""
    if not isinstance(freq, dict):
        raise ValueError(f"token frequencies: expected a mapping of token id to count, got {type(freq).__name__}")
    values = [int(v) for v in freq.values()]
    if any(v < 0 for v in values):
        raise ValueError("token frequencies: a negative count")
    return sorted(values, reverse=True)


def covered(sorted_counts: list[int], size: int) -> float | None:
    total = sum(sorted_counts)
    return sum(sorted_counts[:size]) / total if total else None


def by_coverage(freq: Any, vocab: int, share: float = DEFAULT_SHARE, floor: int = DEFAULT_FLOOR) -> VocabChoice:
    """The smallest size covering `share` of the supervised tokens, at least `floor`, at most `vocab`."""
    ranked = counts(freq)
    total = sum(ranked)
    need, running, size = share * total, 0, 0
    for size, c in enumerate(ranked, start=1):
        running += c
        if running >= need:
            break
    size = min(vocab, max(size, floor))
    return VocabChoice(size=size, vocab=vocab, coverage=covered(ranked, size), chosen_by="coverage", share=share,
                       floor=floor, distinct=len(ranked))


def given(freq: Any | None, vocab: int, size: int) -> VocabChoice:
    ranked = counts(freq) if freq is not None else None
    size = min(size, vocab)
    return VocabChoice(size=size, vocab=vocab, coverage=covered(ranked, size) if ranked else None, chosen_by="given",
                       distinct=len(ranked) if ranked else None)


def load_freq(path: str) -> dict[int, int]:
    import torch

    return torch.load(path, weights_only=True)
