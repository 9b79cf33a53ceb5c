"""How much disk the hidden states take, and whether they fit. Pure functions.

Each token of each row is stored once per aux layer plus once for the final layer, at the verifier's dtype:
tokens x (aux layers + 1) x hidden size x 2 bytes for bf16 (4 for a float32 checkpoint such as the demo's). For a 7168-wide verifier with 3 aux layers
that is 57 KB per token: 10K samples of a 1T-parameter model needed 828 GB (10,000 thinking samples of
Kimi-K2.5 at 2,000-8,192 tokens: 1-4.7 TB). When that cannot fit, the advice fits the host: how many rows
would fit, which shorter [prepare] seq_length would, the room another volume needs (and which old runs
free how much, backend/kit/disk.room_hint), and online training only where the GPU plan allows it (the console
says so with --online-ok: on a host whose baseline holds every GPU, as the seed host's TP8, it does not).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

BF16_BYTES = 2
TOKEN_ID_BYTES = 8  # each file also holds the row's token ids, int64
FILE_HEADER_BYTES = 256  # a safetensors header, per row


def hidden_state_bytes(tokens: int, aux_layers: int, hidden_size: int, dtype_bytes: int = BF16_BYTES,
                       rows: int = 0) -> int:
    """Bytes of the hidden-state files for `rows` rows holding `tokens` tokens in all: the states, plus
    the token ids and a header per file (a rounding error next to the states)."""
    if tokens < 0 or aux_layers < 1 or hidden_size < 1 or dtype_bytes < 1 or rows < 0:
        raise ValueError("tokens and rows must be >= 0; aux_layers, hidden_size and dtype_bytes >= 1")
    return tokens * ((aux_layers + 1) * hidden_size * dtype_bytes + TOKEN_ID_BYTES) + rows * FILE_HEADER_BYTES


def gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


@dataclass(frozen=True)
class DiskEstimate:
    rows: int
    tokens: int
    aux_layers: int
    hidden_size: int
    dtype_bytes: int
    need_bytes: int
    free_bytes: int
    reserve_bytes: int  # kept free beyond the estimate
    volume: str

    @property
    def fits(self) -> bool:
        return self.need_bytes + self.reserve_bytes <= self.free_bytes

    def detail(self) -> str:
        return (f"hidden states of {self.rows:,} rows ({self.tokens:,} tokens x ({self.aux_layers} aux layers + 1) "
                f"x hidden {self.hidden_size:,} x {self.dtype_bytes} bytes) need {gb(self.need_bytes)}; "
                f"{gb(self.free_bytes)} free on the volume of {self.volume}"
                + (f" (keeping {gb(self.reserve_bytes)} free)" if self.reserve_bytes else ""))

    @property
    def room(self) -> int:
        """Bytes the states may take here: what is free less what is kept free."""
        return max(0, self.free_bytes - self.reserve_bytes)

    def refusal(self, lengths: Sequence[int] = (), online_ok: bool = False) -> str:
        """What to do when it does not fit, fitted to the host (the module docstring). `lengths`: each
        row's token count (the rows still to extract); `online_ok`: the GPU plan allows online training."""
        short = self.need_bytes + self.reserve_bytes - self.free_bytes
        ways = []
        per_token = (self.aux_layers + 1) * self.hidden_size * self.dtype_bytes + TOKEN_ID_BYTES
        if self.rows:
            per_row = self.need_bytes / self.rows
            fit = int(self.room // per_row) if per_row else self.rows
            ways.append(f"fewer samples: about {fit:,} of these {self.rows:,} rows fit (generate or prepare "
                        f"fewer, e.g. [generate] samples = {fit:,})" if fit else
                        "fewer samples: not one row of this average length fits")
        seq = fitting_seq_length(lengths, self.room, per_token)
        if seq is not None:
            ways.append(f"a shorter sequence length: [prepare] seq_length = {seq:,} (rows clipped to it) fits, "
                        f"then prepare again")
        ways.append(f"another volume: move the work dir to one with at least "
                    f"{gb(self.need_bytes + self.reserve_bytes)} free, or free {gb(short)} here")
        if online_ok:
            ways.append("train online: set [extract] online = true and start train directly on the prepare "
                        "run (speculators' --on-missing generate fetches each batch's hidden states from the "
                        "extraction server and deletes them after use, so nothing is stored)")
        return f"it does not fit ({gb(short)} short). Ways out: " + "; or ".join(ways)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


def fitting_seq_length(lengths: Sequence[int], room: int, per_token: int, floor: int = 16) -> int | None:
    """The longest [prepare] seq_length (a multiple of 128 when over 128; at least `floor`, prepare's own
    minimum) whose clipped rows fit in `room` bytes; None when none does or no row is longer than it."""
    if not lengths or per_token < 1:
        return None
    longest = max(lengths)

    def need(limit: int) -> int:
        return sum(min(n, limit) for n in lengths) * per_token + len(lengths) * FILE_HEADER_BYTES

    if need(floor) > room:
        return None
    lo, hi = floor, longest  # need(lo) fits; find the largest that does
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(mid) <= room else (lo, mid - 1)
    if lo >= longest:
        return None  # nothing to clip: the rows fit as they are (the estimate's rounding aside)
    return lo // 128 * 128 if lo > 128 else lo


def estimate(*, rows: int, tokens: int, aux_layers: int, hidden_size: int, free_bytes: int,
             reserve_bytes: int, volume: str, dtype_bytes: int = BF16_BYTES) -> DiskEstimate:
    return DiskEstimate(rows=rows, tokens=tokens, aux_layers=aux_layers, hidden_size=hidden_size,
                        dtype_bytes=dtype_bytes,
                        need_bytes=hidden_state_bytes(tokens, aux_layers, hidden_size, dtype_bytes, rows=rows),
                        free_bytes=free_bytes, reserve_bytes=reserve_bytes, volume=volume)
