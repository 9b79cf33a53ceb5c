"""Profile schema: one TOML file = one GPU host and one pipeline.

Every value that can reach a shell, a unit name or a path is checked here, once, so the rest of the code
may rely on it. Errors name the file, the key path and what was expected; all problems of a file are
reported together so an operator fixes them in one pass.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import tomli_w

from backend.bench.compare import check_reference
from backend.fetch_drafter.names import endpoint_problem, repo_id_problem, revision_problem
from backend.verify.report import K_MAX

# --- value checks -----------------------------------------------------------------------------------

# Whole-string patterns, always used with fullmatch: `$` would also accept a trailing newline.
_HOSTNAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_IPV6 = re.compile(r"[0-9A-Fa-f:]+")
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
_UNIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,127}")
# tmux reads '.' and ':' in a target as window and pane separators, and '#' starts a format
_SESSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_PATH_CHARS = re.compile(r"[A-Za-z0-9_./@+:~-]+")
_MODEL_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./@+:-]{0,255}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_JUMP = re.compile(r"(?:(?P<user>[a-z_][a-z0-9_.-]{0,31})@)?(?P<host>[A-Za-z0-9.-]+)(?::(?P<port>\d{1,5}))?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PY_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_PY_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}(?:\.[A-Za-z_][A-Za-z0-9_]{0,127}){0,15}")


def check_hostname(v: str) -> str | None:
    if v.startswith("-"):
        return "a host name or address (it must not start with '-')"
    if _HOSTNAME.fullmatch(v) or (":" in v and _IPV6.fullmatch(v)):
        return None
    return "a host name such as gpu-host.example (letters, digits, '-' and '.')"


def check_user(v: str) -> str | None:
    return None if _USER.fullmatch(v) else "a user name such as ubuntu (lower-case letters, digits, '_', '-', '.')"


def check_unit(v: str) -> str | None:
    if not _UNIT.fullmatch(v):
        return "a systemd unit name such as vllm-kimi (letters, digits, '_', '.', '@', ':', '-'; no spaces)"
    return None


def check_session(v: str) -> str | None:
    return None if _SESSION.fullmatch(v) else "a tmux session name (letters, digits, '_' and '-' only)"


def check_path(v: str, *, absolute: bool = True) -> str | None:
    if not _PATH_CHARS.fullmatch(v) or v.startswith("-"):
        return "a path of letters, digits and _ . / @ + : ~ - (no spaces or shell characters)"
    if ".." in v.split("/"):
        return "a path without '..' components"
    if absolute and not v.startswith("/"):
        return "an absolute path (starting with '/')"
    if not absolute and not (v.startswith("/") or v.startswith("~/")):
        return "an absolute path or one starting with '~/'"
    return None


def check_local_path(v: str) -> str | None:
    return check_path(v, absolute=False)


def check_model(v: str) -> str | None:
    if v.startswith("/"):
        return check_path(v)
    return None if _MODEL_ID.fullmatch(v) else "a model path or id (letters, digits and _ . / @ + : -)"


def check_env_name(v: str) -> str | None:
    return None if _ENV_NAME.fullmatch(v) else "an environment variable name such as VLLM_API_KEY"


def check_class_name(v: str) -> str | None:
    return None if _PY_IDENT.fullmatch(v) else "a Python class name such as ExampleHiddenStatesConnector"


def check_module_path(v: str) -> str | None:
    return None if _PY_MODULE.fullmatch(v) else "a dotted Python module path such as sim.cpu_hidden_states_connector"


def check_jump(v: str) -> str | None:
    m = _JUMP.fullmatch(v)
    if not m or check_hostname(m["host"]) or (m["port"] and not 0 < int(m["port"]) < 65536):
        return "a jump host as [user@]host[:port]"
    return None


def check_hf_repo(v: str) -> str | None:
    return repo_id_problem(v)


def check_hf_revision(v: str) -> str | None:
    return revision_problem(v)


def check_arg(v: str) -> str | None:
    return "a string without control characters (newlines, NUL)" if _CONTROL.search(v) else None


def check_argv(v: list[str]) -> str | None:
    if not v:
        return "a non-empty list of strings"
    for item in v:
        if check_arg(item):
            return "a list of strings without control characters (newlines, NUL)"
    return None


def check_args(v: list[str]) -> str | None:
    return check_argv(v) if v else None


# --- schema machinery -------------------------------------------------------------------------------

def knob(default: Any = dataclasses.MISSING, *, check: Callable[[Any], str | None] | None = None,
         min: float | None = None, max: float | None = None, choices: tuple[Any, ...] | None = None,
         doc: str = "", expect: str | None = None) -> Any:
    """A profile key: its default, and the constraint shown in error messages (`expect`: what every error
    of a key with several shapes says is expected, instead of the type's name)."""
    meta = {"check": check, "min": min, "max": max, "choices": choices, "doc": doc, "expect": expect}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


class ProfileError(Exception):
    """All problems found in one profile file."""

    def __init__(self, file: str, problems: list[tuple[str, str]]):
        self.file = file
        self.problems = problems
        lines = [f"{file}: {key}: {msg}" if key else f"{file}: {msg}" for key, msg in problems]
        super().__init__("\n".join(lines))


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return "a list of " + {str: "strings", int: "integers"}.get(typing.get_args(tp)[0], "values")
    if origin is dict:
        return "a table"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(tp, str(tp))


def _matches(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        (inner,) = typing.get_args(tp)
        return isinstance(value, list) and all(_matches(v, inner) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if tp is float:
        # TOML has nan and inf: neither is a timeout, a learning rate or a size (`nan < lo` is false,
        # so no range check would ever refuse it)
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is bool:
        return isinstance(value, bool)
    return isinstance(value, tp)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _build(cls: type, table: Any, prefix: str, problems: list[tuple[str, str]]) -> Any:
    if not isinstance(table, dict):
        problems.append((prefix, f"expected a table, got {_describe(table)}"))
        table = {}
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        retired = RETIRED_KEYS.get(f"{prefix}.{key}")
        if retired is not None:
            problems.append((f"{prefix}.{key}", retired(table[key])))
        elif key not in known:
            hint = ""
            if "key" in key or "secret" in key or "token" in key or "password" in key:
                hint = " (secrets never go in a profile: use api_key_env or api_key_file)"
            problems.append((f"{prefix}.{key}", f"unknown key{hint}; expected one of: {', '.join(sorted(known))}"))
    values: dict[str, Any] = {}
    for name, f in known.items():
        key = f"{prefix}.{name}"
        tp = hints[name]
        nested = tp if dataclasses.is_dataclass(tp) else None
        if name not in table:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                if nested:
                    values[name] = _build(nested, {}, key, problems)
                else:
                    problems.append((key, f"missing; expected {_type_name(tp)}{_doc(f)}"))
            continue
        value = table[name]
        if nested:
            values[name] = _build(nested, value, key, problems)
            continue
        if isinstance(value, float) and not math.isfinite(value):
            problems.append((key, f"expected a finite number, got {_describe(value)}"))
            continue
        if not _matches(value, tp):
            problems.append((key, f"expected {f.metadata.get('expect') or _type_name(tp)}, got {_describe(value)}"))
            continue
        meta = f.metadata
        if isinstance(value, float) and typing.get_origin(tp) is None and tp is float:
            value = float(value)
        if meta.get("choices") and value not in meta["choices"]:
            problems.append((key, f"expected one of {', '.join(map(repr, meta['choices']))}, got {_describe(value)}"))
            continue
        lo, hi = meta.get("min"), meta.get("max")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                rng = f"from {lo} to {hi}" if lo is not None and hi is not None else (f">= {lo}" if lo is not None else f"<= {hi}")
                problems.append((key, f"expected a number {rng}, got {_describe(value)}"))
                continue
        check = meta.get("check")
        if check is not None and value is not None:
            err = check(value)
            if err:
                problems.append((key, f"expected {err}, got {_describe(value)}"))
                continue
        values[name] = value
    try:
        return cls(**values)
    except TypeError:
        return None  # problems already name the missing keys


def _doc(f: dataclasses.Field) -> str:
    return f" ({f.metadata['doc']})" if f.metadata.get("doc") else ""


def _to_table(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue  # TOML has no null: an absent key means "not set"
        out[f.name] = _to_table(value) if dataclasses.is_dataclass(value) else value
    return out


# --- the schema -------------------------------------------------------------------------------------

DEFAULT_GPU_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw",
    "--format=csv,noheader,nounits",
]


@dataclass
class HostSection:
    name: str = knob(check=check_hostname, doc="the GPU host's name, e.g. gpu-host.example")
    transport: str = knob("ssh", choices=("ssh", "local"))
    user: str | None = knob(None, check=check_user)
    port: int = knob(22, min=1, max=65535)
    identity_file: str | None = knob(None, check=check_local_path)
    jump_host: str | None = knob(None, check=check_jump)
    known_hosts: str | None = knob(None, check=check_local_path,
                                   doc="default ~/.ssh/known_hosts; checking is never switched off")
    simulated: bool = knob(False, doc="a demo host: every view is labelled SIMULATED")
    forward_agent: bool = knob(False, doc="forward your ssh-agent to the host; off unless set here, whatever "
                                          "~/.ssh/config says (whoever is root there can use the agent's keys)")


@dataclass
class ServerSection:
    model_path: str = knob(check=check_model, doc="the --model path or id vLLM serves")
    manager: str = knob("systemd", choices=("systemd", "tmux"))
    unit: str = knob("vllm", check=check_unit, doc="systemd unit, or tmux session name")
    served_model_name: str | None = knob(None, check=check_model)
    port: int = knob(8000, min=1, max=65535)
    vllm_args: list[str] = knob([], check=check_args)
    reasoning_parser: str | None = knob(None, check=check_model)
    expect_reasoning: bool = knob(True)
    command: list[str] = knob([], check=check_args,
                              doc="tmux manager: the server command; default `vllm serve MODEL ...`")
    api_key_env: str | None = knob(None, check=check_env_name)
    api_key_file: str | None = knob(None, check=check_local_path)
    load_timeout_s: float = knob(3600.0, min=10, max=86400)
    stop_timeout_s: float = knob(120.0, min=1, max=3600, doc="how long a SIGTERM'd server may take to exit")
    gpu_release_timeout_s: float = knob(120.0, min=1, max=3600,
                                        doc="after a server stops, how long the next may wait for its GPUs' "
                                            "memory to be released (no compute process, memory near idle)")
    sudo: bool = knob(False, doc="run systemctl / systemd-run through `sudo -n` (non-root SSH user)")
    expected_weights_gib: float | None = knob(None, min=0.001, max=100000,
                                              doc="per GPU; used for load progress until a load is seen")

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.model_path


@dataclass
class PathsSection:
    work_dir: str = knob(check=check_path, doc="where runs, logs and the backend copy live on the host")
    data_dir: str = knob("/data", check=check_path)
    python: str = knob("python3", check=check_model, doc="the host's python with the backend's modules")


@dataclass
class GpusSection:
    command: list[str] = knob(list(DEFAULT_GPU_QUERY), check=check_argv)
    count: int | None = knob(None, min=1, max=1024)


def check_sources(v: list[dict[str, Any]]) -> str | None:
    """[[generate.sources]] tables: name, dataset (a host path), count or share (backend/generate/sources.py)."""
    from backend.generate.sources import SourceError, parse

    try:
        parse(v) if v else None
    except SourceError as exc:
        return str(exc).replace("--sources", "sources")
    for item in v:
        if check_path(item["dataset"]):
            return f"sources: {item['name']}: dataset must be {check_path(item['dataset'])}"
    return None


@dataclass
class GenerateSection:
    dataset: str | None = knob(None, check=check_path)
    samples: int = knob(10000, min=1, max=100_000_000)
    concurrency: int = knob(200, min=1, max=4096)
    max_tokens: int = knob(8192, min=1, max=10_000_000)
    long_prompt: str = knob("reduce", choices=("reduce", "skip"),
                            doc="a prompt that fits the served context only with a smaller max_tokens: "
                                "reduce = send it with max_tokens cut to what fits (noted in its record), "
                                "skip = count it and send nothing; one that cannot fit at all is always "
                                "skipped")
    request_timeout_s: float = knob(1800.0, min=1, max=86400)
    temperature: float = knob(0.6, min=0, max=5)
    top_p: float = knob(0.95, min=0.001, max=1, doc="vLLM accepts (0, 1]")
    chat_template_kwargs: dict[str, Any] = knob({})
    return_token_ids: str = knob("auto", choices=("auto", "on", "off"))
    max_retries: int = knob(5, min=0, max=100)
    sources: list[dict[str, Any]] = knob([], check=check_sources,
                                         doc="instead of dataset: several datasets, each {name, dataset, count} or "
                                             "{name, dataset, share} (a share of `samples`), sampled with "
                                             "selection_seed")
    selection_seed: int = knob(0, min=0, max=2**31 - 1, doc="which rows the sources' sample takes")
    smoke: bool = knob(True, doc="before the run's work, a short burst at its concurrency against the baseline, "
                                 "said beside this host's earlier smokes with the GPUs' clock-throttle reasons "
                                 "(a warning, never a refusal)")


def check_layer_ids(v: list[int]) -> str | None:
    if any(i < 0 for i in v) or len(set(v)) != len(v):
        return "distinct layer ids >= 0 (each below the verifier's layer count, checked on the host)"
    return None


@dataclass
class DrafterSection:
    """What the drafter is built for; shared by extract, train and verify."""
    verifier: str | None = knob(None, check=check_path,
                                doc="the verifier checkpoint directory on the host (config, tokenizer, "
                                    "weights); default server.model_path")
    aux_layer_ids: list[int] = knob([], check=check_layer_ids,
                                    doc="verifier layers whose input states the drafter reads, in vLLM's "
                                        "convention (id L = the state entering layer L); [] = vLLM's default "
                                        "(2, n//2, n-3)")
    num_speculative_tokens: int = knob(3, min=1, max=K_MAX)
    trust_remote_code: bool = knob(False, doc="the verifier's config/tokenizer need their own code (Kimi)")


@dataclass
class PrepareSection:
    seq_length: int = knob(8192, min=16, max=10_000_000, doc="training window; longer rows are clipped")
    heldout_fraction: float = knob(0.05, min=0, max=0.49,
                                   doc="share of rows held out for verify, never trained on (0: none)")
    heldout_min: int = knob(4, min=0, max=1_000_000, doc="hold out at least this many rows (at most half)")
    minimum_valid_tokens: int | None = knob(None, min=1, max=10_000_000,
                                            doc="drop rows with fewer supervised tokens")
    source: str = knob("auto", choices=("auto", "token_rows", "records"),
                       doc="token_rows: the exact ids the server returned; records: the turns rendered by "
                           "the server's chat template; auto: token rows when the run has them")
    render_concurrency: int = knob(8, min=1, max=256)


def check_env(v: dict[str, Any]) -> str | None:
    for key, value in v.items():
        if check_env_name(key) or not isinstance(value, str) or check_arg(value):
            return "a table of environment variable names to strings (no control characters)"
    return None


@dataclass
class ExtractSection:
    online: bool = knob(False, doc="train online: no extract stage; train (and verify) run on the prepare run "
                                   "with the extraction server in the baseline's place, fetching each batch's "
                                   "hidden states and deleting them after use (`run train --online`)")
    server_env: dict[str, Any] = knob({}, check=check_env,
                                      doc="environment of the extraction server (a systemd transient unit does "
                                          "not inherit the baseline unit's Environment=), e.g. "
                                          "CUDA_VISIBLE_DEVICES, HF_HOME")
    connector: str = knob("ExampleHiddenStatesConnector", check=check_class_name,
                          doc="the extraction server's hidden-states KV connector class (--kv-transfer-config "
                              "kv_connector); vLLM's own by default")
    connector_module: str | None = knob(None, check=check_module_path,
                                        doc="the module vLLM imports `connector` from (kv_connector_module_path), "
                                            "importable by the server's Python; default vLLM's registry (the "
                                            "CPU demo: sim.cpu_hidden_states_connector)")
    concurrency: int = knob(8, min=1, max=1024)
    request_timeout_s: float = knob(120.0, min=1, max=86400)
    max_retries: int = knob(2, min=0, max=100)
    validate_outputs: bool = knob(True, doc="load each file after writing and check it (speculators' check)")
    reserve_gib: float = knob(1.0, min=0, max=1_000_000, doc="kept free on the volume beyond the estimate")
    ready_timeout_s: float | None = knob(None, min=10, max=86400,
                                         doc="how long the extraction server may take to load; default "
                                             "server.load_timeout_s")


def check_train_args(v: list[str]) -> str | None:
    """Further `speculators train` flags: plain arguments, none of those the train stage sets itself."""
    err = check_args(v)
    if err:
        return err
    from backend.train.config import OWNED_FLAGS  # the stage's own list: one definition

    owned = sorted({a.split("=", 1)[0] for a in v} & set(OWNED_FLAGS))
    if owned:
        return f"speculators flags the stage does not set itself ({', '.join(owned)} come from [train] keys)"
    return None


def check_from_pretrained(v: str) -> str | None:
    """A run id of the work dir (train or fetch_drafter run) or an absolute checkpoint directory."""
    from backend.contract.runs import RUN_ID_PATTERN

    if RUN_ID_PATTERN.fullmatch(v) or check_path(v) is None:
        return None
    return "a train or fetch_drafter run id, or an absolute checkpoint directory on the host"


TRAIN_GPUS_EXPECTED = "a GPU count 0-1024 (0: the CPU) or a list of distinct GPU indexes 0-1023"


def check_train_gpus(v: int | list[int]) -> str | None:
    if isinstance(v, int):
        return None if 0 <= v <= 1024 else TRAIN_GPUS_EXPECTED
    return None if v and len(set(v)) == len(v) and all(0 <= i < 1024 for i in v) else TRAIN_GPUS_EXPECTED


@dataclass
class TrainSection:
    """The drafter's training (python -m backend.train; speculators' EAGLE-3 trainer)."""
    epochs: int = knob(20, min=1, max=10000)
    learning_rate: float = knob(1e-3, min=0.0, max=10, doc="speculators' --lr")
    draft_vocab_size: int | None = knob(None, min=16, max=10_000_000,
                                        doc="the draft's vocabulary: the N most frequent tokens (>= the verifier's "
                                            "vocabulary: all of it); unset: by vocab_coverage and vocab_floor")
    draft_layers: int = knob(1, min=1, max=64, doc="decoder layers of the draft")
    seq_length: int = knob(8192, min=16, max=10_000_000, doc="tokens per packed training batch")
    optimizer: str = knob("muon", choices=("muon", "adamw"))
    gpus: int | list[int] | None = knob(None, check=check_train_gpus, expect=TRAIN_GPUS_EXPECTED,
                                        doc="the GPUs training uses: a list of indexes (e.g. [4, 5, 6, 7]: the "
                                            "stage sets CUDA_VISIBLE_DEVICES to them, one process each), or a "
                                            "count N = GPUs 0..N-1; 0 trains on the CPU; unset: every GPU")
    checkpoint_freq: float = knob(1.0, min=0.01, max=1000,
                                  doc="epochs between checkpoints; below 1 also saves within an epoch")
    seed: int = knob(0, min=0, max=2**31 - 1)
    extra_args: list[str] = knob([], check=check_train_args)
    from_pretrained: str | None = knob(None, check=check_from_pretrained,
                                       doc="warm start from this drafter (a train or fetch_drafter run id, or a "
                                           "checkpoint directory); it must fit the verifier, the aux layers and "
                                           "the draft vocabulary; its shape replaces draft_layers")
    vocab_coverage: float = knob(0.99, min=0.01, max=1.0,
                                 doc="the default draft vocabulary is the smallest covering this share of the "
                                     "prepare run's supervised tokens")
    vocab_floor: int = knob(32000, min=2, max=10_000_000,
                            doc="the default draft vocabulary holds at least this many tokens")
    acceptance_samples: int = knob(16, min=0, max=100_000,
                                   doc="held-out rows each saved epoch's acceptance is measured on; the best "
                                       "mean accepted length is the checkpoint handed on (0: lowest val loss)")
    acceptance_patience: int = knob(3, min=0, max=100_000,
                                    doc="stop early after this many epochs without a better acceptance (0: never)")

    def stage_args(self) -> list[str]:
        """These settings as `python -m backend.train` flags (backend/train/config.py); the draft tokens come
        from [drafter]. Remote code needs no key: the stage's `--trust-remote-code auto` trusts a verifier
        whose config.json names classes."""
        args = ["--epochs", str(self.epochs), "--lr", repr(self.learning_rate), "--draft-layers",
                str(self.draft_layers), "--seq-length",
                str(self.seq_length), "--optimizer", self.optimizer, "--checkpoint-freq", repr(self.checkpoint_freq),
                "--seed", str(self.seed)]
        if self.draft_vocab_size is not None:
            args += ["--draft-vocab-size", str(self.draft_vocab_size)]
        if isinstance(self.gpus, list):
            args += ["--gpu-ids", ",".join(map(str, self.gpus))]
        elif self.gpus is not None:
            args += ["--gpus", str(self.gpus)]
        if self.extra_args:
            args += ["--extra-args", json.dumps(self.extra_args)]
        if self.from_pretrained is not None:
            args += ["--from-pretrained", self.from_pretrained]
        args += ["--vocab-coverage", repr(self.vocab_coverage), "--vocab-floor", str(self.vocab_floor),
                 "--acceptance-samples", str(self.acceptance_samples),
                 "--acceptance-patience", str(self.acceptance_patience)]
        return args


@dataclass
class VerifySection:
    samples: int = knob(64, min=1, max=1_000_000)


def check_levels(v: list[int]) -> str | None:
    if not v or len(v) > 16 or any(c < 1 or c > 4096 for c in v) or len(set(v)) != len(v):
        return "1 to 16 distinct concurrency levels from 1 to 4096"
    return None


K_VALUES_MAX = 8  # each K of a bench is one more drafter server load (~22 min on the seed host)


def check_k_values(v: list[int]) -> str | None:
    """[bench].k_values and `run bench --k`: the K values one bench run compares."""
    if len(v) > K_VALUES_MAX or any(k < 1 or k > K_MAX for k in v) or len(set(v)) != len(v):
        return f"at most {K_VALUES_MAX} distinct K values (draft tokens per step) from 1 to {K_MAX}"
    return None


def parse_k_values(text: str) -> list[int]:
    """`--k 2,3,4` as a list, checked as [bench].k_values is (ValueError says what is wrong)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--k {text!r}: expected K values separated by commas, e.g. 2,3,4") from None
    problem = check_k_values(values) if values else "no K value"
    if problem:
        raise ValueError(f"--k {text!r}: expected {problem}")
    return values


@dataclass
class ServeDrafterSection:
    """Serving with the drafter: the profile's vLLM command plus --speculative-config (method eagle3, the
    verified checkpoint, [drafter].num_speculative_tokens draft tokens per step)."""
    draft_tensor_parallel_size: int = knob(1, min=1, max=1024,
                                           doc="the draft's tensor-parallel size: 1, or the target's (vLLM "
                                               "accepts nothing else)")


_HUB_ENDPOINT = re.compile(r"https?://[A-Za-z0-9.-]+(?::\d{1,5})?(?:/[A-Za-z0-9._~/-]*)?")


def check_hub_endpoint(v: str) -> str | None:
    if not _HUB_ENDPOINT.fullmatch(v):
        return "an http(s) URL such as https://huggingface.co"
    return endpoint_problem(v)


@dataclass
class BenchSection:
    """python -m backend.bench: the same workload against the baseline and the drafter server."""
    dataset: str | None = knob(None, check=check_path,
                               doc="a file of prompts; default the held-out rows of the latest prepare run")
    num_prompts: int = knob(200, min=1, max=1_000_000)
    concurrency: list[int] = knob([1, 4, 16], check=check_levels, doc="the concurrency levels measured")
    max_tokens: int | None = knob(None, min=1, max=10_000_000,
                                  doc="output length per request; unset: the median completion length of the "
                                      "generation records the prompts come from (the workload's own)")
    temperature: float = knob(0.0, min=0, max=5)
    seed: int = knob(0, min=0, max=2**31 - 1, doc="picks the prompts; request i samples with seed + i")
    k_values: list[int] = knob([], check=check_k_values,
                               doc="bench the drafter at each of these K (draft tokens per step) in one run, one "
                                   "drafter server load per K, and name the best; [] = [drafter] "
                                   "num_speculative_tokens alone (`run bench --k` overrides)")
    client: str = knob("auto", choices=("auto", "vllm", "ours"),
                       doc="vllm: `vllm bench serve` on the host; ours: the built-in client; auto: vllm when "
                           "installed")
    third_drafter: str | None = knob(None, check=check_hf_repo,
                                     doc="a published EAGLE-3 drafter for the same model (owner/name on the Hub): "
                                         "`run fetch-drafter` downloads it on the host, to verify and bench as a "
                                         "third contender")
    third_revision: str = knob("main", check=check_hf_revision, doc="its branch, tag or commit")
    hub_endpoint: str | None = knob(None, check=check_hub_endpoint,
                                    doc="the Hub's address as the host reaches it (default https://huggingface.co)")
    hub_token_env: str = knob("HF_TOKEN", check=check_env_name,
                              doc="the console's environment variable holding a Hub token (gated/private repos)")
    hub_token_file: str | None = knob(None, check=check_local_path, doc="or a file on this machine holding it")
    reference_acceptance: float | None = knob(None, min=1, max=K_MAX + 1,
                                              doc="the field's acceptance length for this model (e.g. 2.88 for "
                                                  "Kimi-K2.5 with thinking, a published EAGLE-3 drafter's), shown "
                                                  "next to the drafter's; needs reference_k")
    reference_k: int | None = knob(None, min=1, max=K_MAX, doc="the K (draft tokens per step) it was measured at")
    split_prompts: int = knob(4, min=0, max=1000,
                              doc="after a drafter's levels, this many requests one at a time whose acceptance is "
                                  "split between reasoning and answer (0: no split)")
    hub_token_upload: bool = knob(False, doc="the drafter's repo is gated or private: hand `run fetch-drafter` the "
                                             "Hub token (never otherwise; the stage removes it once read)")


@dataclass
class NotifySection:
    """A call when a load finishes or fails, or a stage completes or fails (also with --readonly). The
    user config ($XDG_CONFIG_HOME/eagle3-console/config.toml, table [notify]) overrides these keys."""
    bell: bool = knob(True, doc="ring the terminal bell")
    tmux: bool = knob(True, doc="a tmux display-message when the console runs inside tmux ($TMUX)")
    command: list[str] = knob([], check=check_args,
                              doc="a program on this machine (argv list), given the event as JSON on stdin")


@dataclass
class Profile:
    host: HostSection
    server: ServerSection
    paths: PathsSection
    gpus: GpusSection = knob(None)
    generate: GenerateSection = knob(None)
    drafter: DrafterSection = knob(None)
    prepare: PrepareSection = knob(None)
    extract: ExtractSection = knob(None)
    train: TrainSection = knob(None)
    verify: VerifySection = knob(None)
    serve_drafter: ServeDrafterSection = knob(None)
    bench: BenchSection = knob(None)
    notify: NotifySection = knob(None)
    name: str = field(default="", metadata={"internal": True})
    source: str | None = field(default=None, metadata={"internal": True})

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is None and f.name not in ("source",) and not f.metadata.get("internal"):
                setattr(self, f.name, typing.get_type_hints(Profile)[f.name]())

    def to_toml(self) -> str:
        table = {f.name: _to_table(getattr(self, f.name)) for f in dataclasses.fields(self)
                 if not f.metadata.get("internal")}
        return tomli_w.dumps(table)


def _gpu_ids_retired(value: Any) -> str:
    if value == []:
        return "retired key: [train] gpus selects GPUs by index now (e.g. gpus = [4, 5, 6, 7]): remove gpu_ids = []"
    valid = _matches(value, list[int]) and check_train_gpus(value) is None
    text = repr(value) if valid and len(repr(value)) <= 60 else "[..]"
    return f"retired key: [train] gpus selects GPUs by index now: replace gpu_ids with gpus = {text}"


# Keys a profile may still carry from an earlier version: each gets its own message saying what to write
# instead (never silently ignored, never a bare "unknown key").
RETIRED_KEYS: dict[str, Callable[[Any], str]] = {"train.gpu_ids": _gpu_ids_retired}

_SECTIONS = {f.name for f in dataclasses.fields(Profile) if not f.metadata.get("internal")}


def profile_from_dict(data: dict[str, Any], *, file: str = "<profile>", name: str = "") -> Profile:
    problems: list[tuple[str, str]] = []
    for key in data:
        if key not in _SECTIONS:
            problems.append((key, f"unknown table; expected one of: {', '.join(sorted(_SECTIONS))}"))
    hints = typing.get_type_hints(Profile)
    sections = {}
    for section in sorted(_SECTIONS):
        if section not in data and section in ("host", "server", "paths"):
            problems.append((f"[{section}]", "missing table"))
            continue
        sections[section] = _build(hints[section], data.get(section, {}), section, problems)
    if problems:
        raise ProfileError(file, problems)
    profile = Profile(**sections, name=name, source=file)
    _cross_checks(profile, file)
    return profile


def _cross_checks(p: Profile, file: str) -> None:
    problems = []
    if p.server.manager == "tmux" and check_session(p.server.unit):
        problems.append(("server.unit", f"expected {check_session(p.server.unit)} when manager is 'tmux', got {p.server.unit!r}"))
    train_gpus = len(p.train.gpus) if isinstance(p.train.gpus, list) else p.train.gpus
    if p.host.simulated and train_gpus is not None and train_gpus >= 2:
        # the stage counts simulated GPUs but computes on the CPU, where speculators runs one process only
        problems.append(("train.gpus", f"expected 0 or 1 (or one index) on a simulated host (host.simulated = true: "
                                       f"training computes on the CPU there, in one process), got {p.train.gpus!r}"))
    b = p.bench
    if (b.reference_acceptance is None) != (b.reference_k is None):
        key = "bench.reference_k" if b.reference_k is None else "bench.reference_acceptance"
        problems.append((key, "missing; expected reference_acceptance and reference_k together (an acceptance "
                              "length means something only at the K it was measured at)"))
    elif b.reference_k is not None and (why := check_reference(b.reference_acceptance, b.reference_k)):
        key, _, msg = why.partition(": ")
        problems.append((f"bench.{key}", msg))
    if p.host.transport == "ssh" and p.host.simulated is False and p.host.name in ("localhost",) and p.host.port == 22:
        pass  # an operator may well ssh to localhost; nothing to flag
    if problems:
        raise ProfileError(file, problems)


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    file = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProfileError(file, [("", "file not found")]) from None
    except OSError as e:
        raise ProfileError(file, [("", f"cannot read: {e.strerror}")]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ProfileError(file, [("", f"not UTF-8 text (byte {e.start})")]) from None
    except tomllib.TOMLDecodeError as e:
        # tomllib puts "(at line L, column C)" in the message; keep it verbatim
        raise ProfileError(file, [("", f"TOML syntax error: {e}")]) from None
    return profile_from_dict(data, file=file, name=path.stem)


def write_profile(profile: Profile, path: str | Path, *, overwrite: bool = False) -> None:
    """Write with tomli-w; refuses to replace an existing file unless asked (never lose an operator's edits)."""
    path = Path(path)
    text = profile.to_toml()
    profile_from_dict(tomllib.loads(text), file=str(path))  # what we write must load back
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass --force to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def api_key(profile: Profile) -> str | None:
    """From the environment variable or file the profile names; the key itself is never in a profile."""
    s = profile.server
    if s.api_key_env and os.environ.get(s.api_key_env):
        return os.environ[s.api_key_env]
    if s.api_key_file:
        try:
            return Path(s.api_key_file).expanduser().read_text().strip() or None
        except OSError:
            return None
    return None


def hub_token(profile: Profile) -> str | None:
    """The Hub token from the environment variable or file the profile names (never from the profile)."""
    b = profile.bench
    if b.hub_token_env and os.environ.get(b.hub_token_env):
        return os.environ[b.hub_token_env].strip() or None
    if b.hub_token_file:
        try:
            return Path(b.hub_token_file).expanduser().read_text().strip() or None
        except OSError:
            return None
    return None


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "eagle3-console" / "config.toml"


def notify_settings(profile: Profile, path: str | Path | None = None) -> NotifySection:
    """The profile's [notify], with the keys the user config's [notify] sets put over it (the operator's
    own bell and notify command follow them from host to host). A bad user config: ProfileError naming it."""
    path = Path(path) if path is not None else user_config_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return profile.notify
    except OSError as e:
        raise ProfileError(str(path), [("", f"cannot read: {e.strerror}")]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ProfileError(str(path), [("", f"not a TOML file: {e}")]) from None
    problems: list[tuple[str, str]] = []
    for key in data:
        if key != "notify":
            problems.append((key, "unknown table; expected: notify"))
    table = data.get("notify", {})
    if not isinstance(table, dict):
        problems.append(("notify", "expected a table"))
        table = {}
    merged = {**dataclasses.asdict(profile.notify), **table}
    settings = _build(NotifySection, merged, "notify", problems)
    if problems:
        raise ProfileError(str(path), problems)
    return settings
