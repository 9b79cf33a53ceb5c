"""Every knob of the stage, settable as a flag or as the same key in `--config FILE.json`.

Precedence: flags given on the command line > the config file > defaults. Keys in the file use the
flag names with `_` or `-` (`max_tokens` or `max-tokens`); an unknown key is an error, not ignored.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from backend.generate.fit import POLICIES
from backend.kit.lifecycle import ConfigError  # noqa: F401 - the one definition, raised here


@dataclass
class GenerateConfig:
    dataset: str = ""
    work_dir: str = "."
    run_id: str = "generate"
    endpoint: str = "http://127.0.0.1:8000"
    model: str = ""  # the served model id the server must report
    max_tokens: int = 8192
    long_prompt: str = "reduce"  # a prompt that fits only with a smaller max_tokens: reduce | skip
    concurrency: int = 200
    request_timeout: float = 1800.0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # any other request keys (repetition_penalty...)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    return_token_ids: str = "auto"  # auto (if the server returns them) | on | off
    expect_reasoning: bool = True
    limit: int | None = None  # only the first N dataset rows
    sources: list[dict[str, Any]] = field(default_factory=list)  # several datasets, each a count or share
    sample_total: int | None = None  # with shares in --sources: the samples drawn in all
    selection_seed: int = 0  # which rows --sources draws (backend/generate/sources.py)
    max_retries: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    health_interval: float = 2.0
    max_pause_s: float = 0.0  # 0: wait for the server forever
    progress_interval: float = 5.0
    flush_every: int = 64
    min_free_bytes: int = 256 << 20
    stop_grace_s: float = 20.0
    token_rows: bool = True  # also write prepare/tokens.jsonl (input_ids + loss_mask) at the end
    api_key_env: str | None = None
    api_key_file: str | None = None
    remove_api_key_file: bool = False  # the console's copy on the host: removed once read
    fresh: bool = False
    preflight_only: bool = False
    skip_preflight: bool = False
    smoke: bool = True  # the throughput smoke before the real work (backend/generate/smoke.py)
    smoke_seconds: float = 25.0
    nvidia_smi: list[str] | None = None  # how this host's GPUs are asked (default: nvidia-smi)
    server_command: list[str] | None = None  # the baseline's command line as the console knows it (provenance)

    def validate(self) -> None:
        if self.sources:
            from backend.generate.sources import SourceError, parse

            if self.dataset:
                raise ConfigError("give --dataset or --sources, not both")
            if self.limit is not None:
                raise ConfigError("--limit applies to --dataset; with --sources give each source a count")
            try:
                parse(self.sources)
            except SourceError as exc:
                raise ConfigError(str(exc)) from None
            if self.sample_total is not None and self.sample_total < 0:
                raise ConfigError(f"--sample-total must be >= 0, got {self.sample_total}")
        elif not self.dataset:
            raise ConfigError("--dataset is required (a local parquet/jsonl/json file or directory), or --sources")
        if not self.model:
            raise ConfigError("--model is required (the served model id the server must report)")
        if self.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.long_prompt not in POLICIES:
            raise ConfigError(f"--long-prompt must be {' or '.join(POLICIES)}, got {self.long_prompt!r}")
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.request_timeout <= 0:
            raise ConfigError(f"--request-timeout must be > 0, got {self.request_timeout}")
        if self.return_token_ids not in ("auto", "on", "off"):
            raise ConfigError(f"--return-token-ids must be auto, on or off, got {self.return_token_ids!r}")
        if self.max_retries < 0:
            raise ConfigError(f"--max-retries must be >= 0, got {self.max_retries}")
        if self.limit is not None and self.limit < 0:
            raise ConfigError(f"--limit must be >= 0, got {self.limit}")
        if self.flush_every < 1:
            raise ConfigError(f"--flush-every must be >= 1, got {self.flush_every}")
        if not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"--endpoint must be an http(s) URL such as http://127.0.0.1:8000, "
                              f"got {self.endpoint!r}")
        if self.api_key_env and self.api_key_file:
            raise ConfigError("give --api-key-env or --api-key-file, not both")
        if not 0 < self.smoke_seconds <= 120:
            raise ConfigError(f"--smoke-seconds must be in (0, 120], got {self.smoke_seconds}")
        if self.server_command is not None and not all(isinstance(a, str) for a in self.server_command):
            raise ConfigError("--server-command must be a JSON list of strings")
        if self.nvidia_smi is not None and (not self.nvidia_smi or
                                            not all(isinstance(a, str) and a for a in self.nvidia_smi)):
            raise ConfigError("--nvidia-smi must be a JSON list of non-empty strings, e.g. '[\"nvidia-smi\"]'")

    def sampling_params(self) -> dict[str, Any]:
        """Request keys that shape the output (part of the run's identity)."""
        params = dict(self.sampling)
        for key in ("temperature", "top_p", "top_k", "min_p", "seed"):
            value = getattr(self, key)
            if value is not None:
                params[key] = value
        return params

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_BOOLS = {f.name for f in fields(GenerateConfig) if f.type in ("bool", bool)}
_JSON = {"sampling", "chat_template_kwargs"}
_JSON_LISTS = {"sources", "nvidia_smi", "server_command"}
_HELP = {
    "dataset": "local dataset file or directory (parquet, jsonl, json)",
    "work_dir": "the run goes to WORK_DIR/runs/RUN_ID/",
    "endpoint": "server base URL (no /v1)",
    "model": "served model id the server must report (and the request's model)",
    "sampling": "JSON object of extra request keys, e.g. '{\"repetition_penalty\": 1.05}'",
    "chat_template_kwargs": "JSON object, e.g. '{\"thinking\": true}'",
    "return_token_ids": "auto: when the server returns them; on: require; off: never ask",
    "long_prompt": "a prompt that fits the context only with a smaller --max-tokens: reduce (send it with "
                   "max_tokens cut to what fits, noted in its record) or skip (count it, send nothing); a "
                   "prompt that cannot fit at all is always skipped",
    "limit": "use only the first N dataset rows",
    "sources": "JSON list of datasets to draw from, each {\"name\", \"dataset\", \"count\" or \"share\"}: a "
               "seeded sample of each (see backend/generate/sources.py)",
    "sample_total": "with shares in --sources: how many samples to draw in all",
    "selection_seed": "the seed of the --sources sample (the same seed picks the same rows)",
    "max_pause_s": "give up when the server stays down this long (0: wait forever)",
    "api_key_env": "name of the environment variable holding the API key",
    "api_key_file": "file holding the API key",
    "remove_api_key_file": "remove --api-key-file as soon as it is read, whatever the run does next (the "
                           "console's copy in the work dir's secrets/ stays there no longer than needed)",
    "fresh": "archive an existing run directory (renamed, never deleted) and start over",
    "preflight_only": "run the preflight checks, print them as JSON, and exit",
    "smoke": "before the real work, a short burst at --concurrency against the server, its tokens/s said "
             "beside this host's earlier smokes with the GPUs' clock-throttle reasons (a warning, never a "
             "refusal; --no-smoke skips it)",
    "smoke_seconds": "the smoke's burst lasts at most this long",
    "server_command": "the baseline server's command line as the console knows it, a JSON list, recorded in "
                      "the run's host facts when the listening process's own is not visible to this user",
    "nvidia_smi": "how this host's GPUs are asked, as a JSON list (the console passes its profile's [gpus] "
                  "command without its query)",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m backend.generate",
                                description="Generate reasoning-model answers for a prompt dataset.")
    p.add_argument("--config", help="JSON file with the same keys as the flags")
    for f in fields(GenerateConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = _HELP.get(f.name)
        if f.name in _BOOLS:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                           help=help_text)
        elif f.name in _JSON:
            p.add_argument(flag, dest=f.name, type=_json_object(flag), default=None, help=help_text)
        elif f.name in _JSON_LISTS:
            p.add_argument(flag, dest=f.name, type=_json_list(flag), default=None, help=help_text)
        else:
            p.add_argument(flag, dest=f.name, type=_scalar_type(f), default=None, help=help_text)
    return p


def _scalar_type(f: Any) -> Any:
    text = str(f.type)
    if text.startswith("int"):
        return int
    if text.startswith("float"):
        return float
    return str


def _json_object(flag: str) -> Any:
    def parse(text: str) -> dict[str, Any]:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{flag}: not valid JSON ({exc})") from exc
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag}: expected a JSON object")
        return value
    return parse


def _json_list(flag: str) -> Any:
    def parse(text: str) -> list[Any]:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{flag}: not valid JSON ({exc})") from exc
        if not isinstance(value, list):
            raise argparse.ArgumentTypeError(f"{flag}: expected a JSON list")
        return value
    return parse


def load_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc.strerror})") from exc
    except ValueError as exc:
        raise ConfigError(f"--config {path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a JSON object of flag names to values")
    names = {f.name: f for f in fields(GenerateConfig)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in names:
            raise ConfigError(f"--config {path}: unknown key {key!r}")
        out[name] = _check_value(path, name, value)
    return out


def _check_value(path: str, name: str, value: Any) -> Any:
    f = {f.name: f for f in fields(GenerateConfig)}[name]
    t = str(f.type)
    ok = (value is None and "None" in t) or (
        (name in _BOOLS and isinstance(value, bool))
        or (name in _JSON and isinstance(value, dict))
        or (name in _JSON_LISTS and isinstance(value, list))
        or (t.startswith("int") and isinstance(value, int) and not isinstance(value, bool))
        or (t.startswith("float") and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (t.startswith("str") and isinstance(value, str)))
    if not ok:
        raise ConfigError(f"--config {path}: {name} has the wrong type ({type(value).__name__}; "
                          f"expected {t})")
    return float(value) if t.startswith("float") and value is not None else value


def parse_config(argv: list[str] | None = None) -> GenerateConfig:
    args = build_parser().parse_args(argv)
    merged: dict[str, Any] = {}
    if args.config:
        merged.update(load_config_file(args.config))
    for f in fields(GenerateConfig):
        value = getattr(args, f.name)
        if value is not None:
            merged[f.name] = value
    config = GenerateConfig(**merged)
    config.validate()
    return config
