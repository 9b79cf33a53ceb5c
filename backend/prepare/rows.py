"""Training rows (`input_ids` + `loss_mask`) as the prepare stage judges and splits them. Pure functions.

A row is kept only when speculators would keep it AND it is usable with this verifier: the same clipping
to `seq_length` and the same minimum of supervised tokens as speculators' prepare-data, so the counts
reported here are the counts in the dataset it writes; plus checks it does not make (token ids inside the
verifier's vocabulary, one row per sample id). Every dropped row has exactly one reason from REASONS.

The held-out slice is chosen by sample id, not by position: a hash of (seed, id) ranks the rows and the
lowest ranks are held out, so the same generation run always gives the same split, whatever the order
its records were written in, and a drafter never trains on a held-out sample.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

UNREADABLE = "unreadable line"
MALFORMED = "malformed row"
OUT_OF_VOCAB = "token id outside the verifier's vocabulary"
DUPLICATE = "duplicate sample id"
UNSUPERVISED = "no supervised tokens"
PROMPT_FILLS = "prompt fills seq_length"
TOO_FEW = "fewer supervised tokens than minimum_valid_tokens"
RENDER_FAILED = "render failed"
UNSTABLE_TEMPLATE = "chat template not prefix-stable at the answer"
NO_ANSWER = "no assistant answer"
REASONS = (UNREADABLE, MALFORMED, OUT_OF_VOCAB, DUPLICATE, UNSUPERVISED, PROMPT_FILLS, TOO_FEW, RENDER_FAILED,
           UNSTABLE_TEMPLATE, NO_ANSWER)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def check_row(row: Any, *, vocab_size: int, seq_length: int, minimum_valid_tokens: int | None) -> str | None:
    """Why `row` must be dropped (one of REASONS), or None when it is kept."""
    if not isinstance(row, dict):
        return MALFORMED
    ids, mask = row.get("input_ids"), row.get("loss_mask")
    if not _int_list(ids) or not _int_list(mask) or not ids or len(ids) != len(mask) \
            or any(m not in (0, 1) for m in mask) or not isinstance(row.get("id"), str):
        return MALFORMED
    if min(ids) < 0 or max(ids) >= vocab_size:
        return OUT_OF_VOCAB
    if not any(mask):
        return UNSUPERVISED
    supervised = sum(mask[:seq_length])
    if supervised == 0:
        return PROMPT_FILLS  # every supervised token lies past seq_length: speculators drops the row
    if minimum_valid_tokens is not None and supervised < minimum_valid_tokens:
        return TOO_FEW
    return None


def clipped(row: dict[str, Any], seq_length: int) -> tuple[int, int, bool]:
    """(tokens, supervised tokens, was clipped) of a kept row as the dataset will hold it."""
    ids = row["input_ids"]
    return min(len(ids), seq_length), sum(row["loss_mask"][:seq_length]), len(ids) > seq_length


def heldout_count(rows: int, fraction: float, minimum: int) -> int:
    """How many of `rows` usable rows to hold out: ceil(fraction x rows), at least `minimum`, never more
    than half (the drafter needs rows to train on); none when fraction is 0."""
    if fraction <= 0 or rows < 2:
        return 0
    return min(max(math.ceil(fraction * rows), minimum), rows // 2)


def rank(sample_id: str, seed: int) -> bytes:
    return hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()


def choose_heldout(ids: Iterable[str], count: int, seed: int) -> set[str]:
    """The `count` ids with the lowest hash rank: a deterministic, order-free slice."""
    return set(sorted(ids, key=lambda i: rank(i, seed))[:count]) if count > 0 else set()


@dataclass
class Tally:
    """Counts for the summary: rows read, kept per side, dropped per reason, tokens of kept rows."""
    read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    supervised: int = 0
    clipped: int = 0

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def keep(self, tokens: int, supervised: int, was_clipped: bool) -> None:
        self.kept += 1
        self.tokens += tokens
        self.supervised += supervised
        self.clipped += was_clipped

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def supervised_share(self) -> float:
        return round(self.supervised / self.tokens, 4) if self.tokens else 0.0
