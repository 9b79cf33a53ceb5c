"""The extract stage's settings: `python -m backend.extract --help` lists them."""
from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

from backend.kit.lifecycle import ConfigError  # noqa: F401 - the one definition, raised here


@dataclass
class ExtractConfig:
    work_dir: str
    run_id: str
    input_run: str
    verifier: str
    aux_layer_ids: list[int] | None = None  # None: vLLM's default for the verifier, (2, n//2, n-3)
    plan: str | None = None  # the swap plan (JSON file); without it, --endpoint names a running extractor
    endpoint: str | None = None
    concurrency: int = 8
    request_timeout: float = 120.0
    max_retries: int = 2
    validate_outputs: bool = True
    reserve_bytes: int = 1 << 30  # left free on the volume beyond the estimate
    health_interval: float = 1.0
    dead_after: int = 3  # consecutive failed health checks that mean the extractor died
    progress_interval: float = 2.0
    stop_grace_s: float = 20.0
    fresh: bool = False
    preflight_only: bool = False
    online_ok: bool = False  # the host's GPU plan allows online training: the disk refusal may advise it

    def validate(self) -> None:
        if (self.plan is None) == (self.endpoint is None):
            raise ConfigError("give --plan FILE (the stage swaps the baseline server for an extraction server) "
                              "or --endpoint URL (an extraction server already running), not both")
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"--endpoint must be an http(s) URL such as http://127.0.0.1:8000, got "
                              f"{self.endpoint!r}")
        for name in ("concurrency", "dead_after"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        for name in ("request_timeout", "health_interval", "progress_interval", "stop_grace_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0")
        if self.max_retries < 0 or self.reserve_bytes < 0:
            raise ConfigError("--max-retries and --reserve-bytes must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _layer_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.strip("[]() ").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer ids such as 2,30,58, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one layer id")
    return ids


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m backend.extract",
                                description="The verifier's hidden states for a prepare run's rows, by "
                                            "speculators' generate-offline-data against an extraction server.")
    a = p.add_argument
    a("--work-dir", required=True)
    a("--run-id", required=True)
    a("--input-run", required=True, help="the completed prepare run")
    a("--verifier", required=True, help="the verifier's checkpoint directory on this host")
    a("--aux-layer-ids", type=_layer_ids, help="e.g. 2,30,58 (default: vLLM's 2,n//2,n-3)")
    a("--plan", help="swap plan JSON: stop the baseline, start the extraction server, and back afterwards")
    a("--endpoint", help="an extraction server already running (base URL, no /v1); nothing is swapped")
    a("--concurrency", type=int, default=8)
    a("--request-timeout", type=float, default=120.0)
    a("--max-retries", type=int, default=2)
    a("--validate-outputs", action=argparse.BooleanOptionalAction, default=True,
      help="load each file after writing and check its token ids and length (speculators' check)")
    a("--reserve-bytes", type=int, default=1 << 30, help="keep this much free beyond the estimate")
    a("--health-interval", type=float, default=1.0)
    a("--dead-after", type=int, default=3, help="failed health checks in a row that mean the server died")
    a("--progress-interval", type=float, default=2.0)
    a("--stop-grace-s", type=float, default=20.0)
    a("--fresh", action="store_true", help="archive an existing run directory and start over")
    a("--preflight-only", action="store_true", help="print the checks (and the disk estimate) as JSON, exit")
    a("--online-ok", action="store_true",
      help="the host's GPU plan allows online training (the console says so): a disk refusal may advise it")
    return p


def parse_config(argv: list[str] | None = None) -> ExtractConfig:
    config = ExtractConfig(**vars(build_parser().parse_args(argv)))
    config.validate()
    return config
