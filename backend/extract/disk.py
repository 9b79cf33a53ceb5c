"""How much disk the hidden states take, and whether they fit. Pure functions.

Each token of each row is stored once per aux layer plus once for the final layer, at the verifier's dtype:
tokens x (aux layers + 1) x hidden size x 2 bytes for bf16 (4 for a float32 checkpoint such as the demo's). For a 7168-wide verifier with 3 aux layers
that is 57 KB per token: 10K samples of a 1T-parameter model needed 828 GB. When that cannot fit, the
answer is online training, which fetches each batch's hidden states from the extraction server and
deletes them after use.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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

    def refusal(self) -> str:
        """What to do when it does not fit: the operator's three ways out, online training first."""
        short = self.need_bytes + self.reserve_bytes - self.free_bytes
        return (f"it does not fit ({gb(short)} short). Train online instead: set [extract] online = true and "
                f"start train directly on the prepare run (speculators' --on-missing generate fetches each "
                f"batch's hidden states from the extraction server and deletes them after use, so nothing "
                f"is stored); or free space there, or move the work dir to a larger volume")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


def estimate(*, rows: int, tokens: int, aux_layers: int, hidden_size: int, free_bytes: int,
             reserve_bytes: int, volume: str, dtype_bytes: int = BF16_BYTES) -> DiskEstimate:
    return DiskEstimate(rows=rows, tokens=tokens, aux_layers=aux_layers, hidden_size=hidden_size,
                        dtype_bytes=dtype_bytes,
                        need_bytes=hidden_state_bytes(tokens, aux_layers, hidden_size, dtype_bytes, rows=rows),
                        free_bytes=free_bytes, reserve_bytes=reserve_bytes, volume=volume)
