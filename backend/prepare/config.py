"""The prepare stage's settings: `python -m backend.prepare --help` lists them."""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

from backend.kit.lifecycle import ConfigError  # noqa: F401 - the one definition, raised here


SOURCES = ("auto", "token_rows", "records")


@dataclass
class PrepareConfig:
    work_dir: str
    run_id: str
    input_run: str
    verifier: str
    seq_length: int = 8192
    heldout_fraction: float = 0.05
    heldout_min: int = 4
    minimum_valid_tokens: int | None = None
    source: str = "auto"  # auto: the exact token rows when the generation run has them, else render
    render_endpoint: str | None = None
    render_concurrency: int = 8
    max_render_failures: int = 32  # consecutive failed renders before the stage gives up on the endpoint
    seed: int = 0
    trust_remote_code: bool = False
    progress_interval: float = 2.0
    fresh: bool = False

    def validate(self) -> None:
        if self.seq_length < 16:
            raise ConfigError(f"--seq-length must be >= 16, got {self.seq_length}")
        if not 0 <= self.heldout_fraction < 0.5:
            raise ConfigError(f"--heldout-fraction must be in [0, 0.5), got {self.heldout_fraction}")
        if self.heldout_min < 0:
            raise ConfigError(f"--heldout-min must be >= 0, got {self.heldout_min}")
        if self.minimum_valid_tokens is not None and self.minimum_valid_tokens < 1:
            raise ConfigError(f"--minimum-valid-tokens must be >= 1, got {self.minimum_valid_tokens}")
        if self.source not in SOURCES:
            raise ConfigError(f"--source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.render_endpoint is not None and not self.render_endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"--render-endpoint must be an http(s) URL such as http://127.0.0.1:8000, "
                              f"got {self.render_endpoint!r}")
        if self.render_concurrency < 1 or self.max_render_failures < 1:
            raise ConfigError("--render-concurrency and --max-render-failures must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m backend.prepare",
                                description="A generation run's output -> speculators' prepared datasets "
                                            "(train and held-out) and token_freq.pt.")
    a = p.add_argument
    a("--work-dir", required=True, help="runs live in WORK_DIR/runs/")
    a("--run-id", required=True)
    a("--input-run", required=True, help="the completed generate run to prepare")
    a("--verifier", required=True, help="the verifier's checkpoint directory on this host")
    a("--seq-length", type=int, default=8192, help="training window: longer rows are clipped")
    a("--heldout-fraction", type=float, default=0.05, help="share of rows never trained on (0: none)")
    a("--heldout-min", type=int, default=4, help="hold out at least this many rows (at most half)")
    a("--minimum-valid-tokens", type=int, help="drop rows with fewer supervised tokens")
    a("--source", choices=SOURCES, default="auto",
      help="token_rows: the exact ids the server returned; records: render the turns; auto: token rows "
           "when the run has them")
    a("--render-endpoint", help="server base URL (no /v1) whose /v1/chat/completions/render tokenizes turns")
    a("--render-concurrency", type=int, default=8)
    a("--max-render-failures", type=int, default=32)
    a("--seed", type=int, default=0, help="decides the held-out slice and speculators' shuffle")
    a("--trust-remote-code", action="store_true", help="the verifier's tokenizer needs its own code")
    a("--progress-interval", type=float, default=2.0)
    a("--fresh", action="store_true", help="archive an existing run directory and start over")
    return p


def parse_config(argv: list[str] | None = None) -> PrepareConfig:
    ns = build_parser().parse_args(argv)
    config = PrepareConfig(**vars(ns))
    config.validate()
    return config
