"""The stand-in's extraction mode: vLLM's `extract_hidden_states` speculative method with its hidden-states
KV connector (ExampleHiddenStatesConnector), computing REAL hidden states with the tiny verifier.

Started as vLLM is (flags parsed in config.py):
    --speculative-config '{"method": "extract_hidden_states", "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}}'
    --kv-transfer-config '{"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/dir"}}'

Exactly the states asked for, as vLLM writes them: one per listed id (`num_hidden_states = len(layer_ids)`,
vllm/v1/spec_decode/extract_hidden_states.py), nothing appended. The model hands them over in layer order
(it keeps the ids as `tuple(sorted(set(ids)))`, model_executor/models/interfaces.py), so the file holds them
ascending whatever order they were listed in; id n (the layer count) is the last layer's output before the
final norm, ids beyond it are never matched. Ids that give fewer states than listed (a repeat, one past n)
fail every request in vLLM (the V2 runner raises `Expected N auxiliary hidden states, got M`); the stand-in
refuses them at start-up, no kinder.

What a client sees, as in vLLM's connector (vllm/distributed/kv_transfer/kv_connector/v1/
example_hidden_states_connector.py): every completion or chat completion writes the prompt's hidden
states to `<shared_storage_path>/<request id>.safetensors` (`token_ids` = the prompt ids, `hidden_states`
[seq, len(ids), hidden] in the model's dtype: sim/hidden_states.py) and answers with the path in a top-level
`kv_transfer_params: {"hidden_states_path": ...}`. The companion `<path>.lock` is created with LOCK_EX
held BEFORE the answer goes out and released when the file is written, which happens after the answer
(vLLM writes from a thread pool), so a client must wait on the lock as speculators does. A request's own
`kv_transfer_params.hidden_states_path` is honoured only with `allow_custom_save_path` (else ignored, with
vLLM's warning). Streaming answers carry no path (speculators never streams here).
"""
from __future__ import annotations

import asyncio
import fcntl
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sim.config import SimConfig
from sim.loadlog import WORKER, LogSink

WRITER_THREADS = 8  # vLLM's num_writer_threads default


def startup_problem(cfg: SimConfig, backend: Any) -> str | None:
    """Why the extraction server cannot start with this text backend (vLLM fails at model init), or None."""
    if cfg.traits().version_tuple < (0, 18, 0):  # the method came in 0.18.0 (vllm/config/speculative.py)
        return (f"vLLM {cfg.vllm_version} has no speculative method 'extract_hidden_states' (it came in 0.18.0): "
                f"run the extraction server with vLLM >= 0.18")
    layers = getattr(backend, "layers", None)
    if not hasattr(backend, "hidden_states") or not isinstance(layers, int):
        return (f"extract_hidden_states needs a real model: the {getattr(backend, 'name', '?')} text backend "
                f"has no hidden states (start the stand-in with --text-backend tinylm)")
    from sim.hidden_states import check_layer_ids

    asked = list(cfg.extract_layers or ())
    try:
        check_layer_ids(asked, layers)
    except ValueError as exc:
        return f"eagle_aux_hidden_state_layer_ids {asked}: {exc}"
    served = served_layers(asked)
    if len(served) != len(asked):
        return (f"eagle_aux_hidden_state_layer_ids {asked}: Expected {len(asked)} auxiliary hidden states, "
                f"got {len(served)} (a layer is listed twice)")
    return None


def served_layers(layer_ids: Any) -> list[int]:
    """The layers whose states the model hands over, in the order it does: ascending, each once."""
    return sorted({int(i) for i in layer_ids})


class HiddenStatesWriter:
    def __init__(self, cfg: SimConfig, backend: Any, sink: LogSink):
        self.backend = backend
        self.layer_ids = served_layers(cfg.extract_layers or ())
        self.storage = cfg.hs_storage
        self.use_lock = cfg.hs_lock
        self.allow_custom = cfg.hs_custom_path
        self.sink = sink
        self._pool = ThreadPoolExecutor(max_workers=WRITER_THREADS, thread_name_prefix="vllm-hs-save")

    def _path(self, request_id: str, params: Any) -> str:
        custom = params.get("hidden_states_path") if isinstance(params, dict) else None
        if custom is not None and not self.allow_custom:
            self.sink.line(WORKER, "example_hidden_states_connector.py:455",
                           f"Request {request_id} provided hidden_states_path but allow_custom_save_path is "
                           f"disabled. Ignoring custom path and using default.", "WARNING")
            custom = None
        return str(custom) if custom else os.path.join(self.storage, f"{request_id}.safetensors")

    @staticmethod
    def _take_lock(path: str) -> int:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    async def capture(self, request_id: str, prompt_ids: list[int], params: Any) -> dict[str, Any]:
        """Compute the prompt's hidden states, start writing them, and return the kv_transfer_params."""
        path = self._path(request_id, params)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        lock_fd = self._take_lock(path) if self.use_lock else None
        try:
            states = await asyncio.to_thread(self.backend.hidden_states, prompt_ids, self.layer_ids)
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise
        asyncio.get_running_loop().run_in_executor(self._pool, self._write, path, list(prompt_ids), states,
                                                   lock_fd)
        return {"hidden_states_path": path}

    def _write(self, path: str, token_ids: list[int], states: Any, lock_fd: int | None) -> None:
        from sim import hidden_states

        try:
            hidden_states.save(path, token_ids, states)
        except Exception as exc:  # vLLM logs the failed write; the client times out on the file
            self.sink.line(WORKER, "example_hidden_states_connector.py:314",
                           f"Hidden-states write failed for {path}: {exc!r}", "ERROR")
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX: a client waiting on the lock goes on

    def close(self) -> None:
        self._pool.shutdown(wait=True)
