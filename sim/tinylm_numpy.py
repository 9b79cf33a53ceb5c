"""The tiny verifier's forward pass in numpy: the stand-in's plain serving, without torch or transformers.

A stand-in that only generates text paid 5 to 7 CPU-s at every start importing torch and transformers
(transformers alone pulls in torch's compiler and distributed packages) to run a 4-layer model of width 64;
the suite starts about 80 of them. vLLM runs its own implementation of the architecture, not Hugging Face's,
so this one is as faithful a stand-in for it: the same computation as transformers' LlamaForCausalLM in
float32 (RMSNorm, rotary embeddings of the default kind, grouped-query attention, SwiGLU), checked against
it token for token in tests/test_sim_tinylm_numpy.py. Serving a drafter or extracting hidden states still
takes the torch model (speculators' draft model and the hidden-state files are torch's).

`supports(config)` says whether a checkpoint is one this covers; anything else is served by torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def supports(config: dict[str, Any]) -> str | None:
    """None when this forward pass computes what transformers would for `config`, else the reason why not."""
    checks = {
        "architectures": (config.get("architectures") == ["LlamaForCausalLM"], "not LlamaForCausalLM"),
        "hidden_act": (config.get("hidden_act", "silu") == "silu", "hidden_act is not silu"),
        "biases": (not config.get("attention_bias") and not config.get("mlp_bias"), "biased projections"),
        "rope": (_rope(config).get("rope_type", "default") == "default", "a scaled rotary embedding"),
        "tp": (config.get("pretraining_tp", 1) == 1, "pretraining_tp > 1"),
    }
    reasons = [why for ok, why in checks.values() if not ok]
    return ", ".join(reasons) if reasons else None


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    # transformers 5 nests it under rope_parameters; 4.x kept rope_theta and rope_scaling at the top
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return {"rope_theta": config.get("rope_theta", 10000.0), **params}


@dataclass
class Layer:
    """One decoder layer's weights, transposed for `x @ w`. The projections that read the same input are
    joined (q|k|v, gate|up): a decode step is one token, and a numpy call's fixed cost outweighs its
    arithmetic at this width: with fewer, wider products (and no copied cache) a step costs a third less."""
    qkv: np.ndarray
    o: np.ndarray
    gate_up: np.ndarray
    down: np.ndarray
    input_norm: np.ndarray
    post_norm: np.ndarray


class Cache:
    """Keys and values of every layer, preallocated for `capacity` positions: [layers][kv heads, pos, dim]."""

    def __init__(self, model: "NumpyLlama", capacity: int):
        shape = (model.kv_heads, capacity, model.head_dim)
        self.k = [np.empty(shape, np.float32) for _ in model.layers]
        self.v = [np.empty(shape, np.float32) for _ in model.layers]
        self.length = 0


class NumpyLlama:
    def __init__(self, directory: Path):
        from safetensors.numpy import load_file

        self.config = json.loads((directory / "config.json").read_text())
        why = supports(self.config)
        if why:
            raise ValueError(f"{directory}/config.json: the numpy forward pass does not cover it ({why})")
        c = self.config
        self.heads = int(c["num_attention_heads"])
        self.kv_heads = int(c.get("num_key_value_heads") or self.heads)
        self.head_dim = int(c.get("head_dim") or c["hidden_size"] // self.heads)
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.max_positions = int(c["max_position_embeddings"])
        w = {k: v.astype(np.float32, copy=False) for k, v in load_file(str(directory / "model.safetensors")).items()}
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = w["lm_head.weight"] if "lm_head.weight" in w else self.embed  # tied embeddings
        self.norm = w["model.norm.weight"]
        self.group = self.heads // self.kv_heads  # query heads per key/value head
        self.layers = [self._layer(w, f"model.layers.{i}.") for i in range(int(c["num_hidden_layers"]))]
        theta = float(_rope(c)["rope_theta"])
        self.inv_freq = (1.0 / theta ** (np.arange(0, self.head_dim, 2, dtype=np.int64).astype(np.float32)
                                          / self.head_dim)).astype(np.float32)

    @staticmethod
    def _layer(w: dict[str, np.ndarray], p: str) -> Layer:
        def t(*names: str) -> np.ndarray:
            return np.ascontiguousarray(np.concatenate([w[p + name + ".weight"].T for name in names], axis=1))

        return Layer(t("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), t("self_attn.o_proj"),
                     t("mlp.gate_proj", "mlp.up_proj"), t("mlp.down_proj"),
                     w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"])

    def new_cache(self, capacity: int) -> Cache:
        return Cache(self, min(capacity, self.max_positions))

    def forward(self, ids: list[int], cache: Cache) -> np.ndarray:
        """Logits [len(ids), vocab] of `ids` placed after what `cache` holds, which then holds them too."""
        start, n = cache.length, len(ids)
        heads, kv_heads, group, d = self.heads, self.kv_heads, self.group, self.head_dim
        q_width, kv_width = heads * d, kv_heads * d
        x = self.embed[np.asarray(ids, dtype=np.int64)]
        cos, sin = self._rotary(np.arange(start, start + n, dtype=np.int64))
        # one token sees every earlier position: no mask. The query heads that share a key/value head are
        # stacked as rows of one product with it (grouped-query attention without copying the cache).
        mask = None if n == 1 else np.tile(np.triu(np.full((n, start + n), -np.inf, np.float32), k=start + 1),
                                           (group, 1))
        scale = np.float32(d ** -0.5)
        for layer, k_all, v_all in zip(self.layers, cache.k, cache.v):
            qkv = self._rms(x, layer.input_norm) @ layer.qkv
            # rotary on the query and key heads together: [heads + kv heads, n, d]
            qk = qkv[:, :q_width + kv_width].reshape(n, heads + kv_heads, d).transpose(1, 0, 2)
            qk = qk * cos + _rotate_half(qk) * sin
            k_all[:, start:start + n] = qk[heads:]
            v_all[:, start:start + n] = qkv[:, q_width + kv_width:].reshape(n, kv_heads, d).transpose(1, 0, 2)
            q = qk[:heads].reshape(kv_heads, group * n, d)
            scores = q @ k_all[:, :start + n].transpose(0, 2, 1) * scale
            if mask is not None:
                scores += mask
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attn = (scores / scores.sum(axis=-1, keepdims=True)) @ v_all[:, :start + n]
            x = x + attn.reshape(heads, n, d).transpose(1, 0, 2).reshape(n, q_width) @ layer.o
            gate_up = self._rms(x, layer.post_norm) @ layer.gate_up
            gate, up = gate_up[:, :gate_up.shape[1] // 2], gate_up[:, gate_up.shape[1] // 2:]
            x = x + ((gate / (1.0 + np.exp(-gate))) * up) @ layer.down
        cache.length = start + n
        return self._rms(x, self.norm) @ self.lm_head.T

    def _rms(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        # np.mean's own arithmetic (a float32 sum, then the division) without its Python-level wrapper
        mean = np.add.reduce(x * x, axis=-1, keepdims=True) / np.float32(x.shape[-1])
        return weight * (x / np.sqrt(mean + np.float32(self.eps)))

    def _rotary(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        freqs = np.outer(positions.astype(np.float32), self.inv_freq)
        emb = np.concatenate([freqs, freqs], axis=-1)
        return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


# ---- sampling ----------------------------------------------------------------------------------------------
def sampling_probs(logits: np.ndarray, temperature: float, top_p: float, top_k: int | None) -> np.ndarray:
    """The distribution a token is drawn from at temperature > 0, after top-k and top-p: TinyText._probs's
    computation in numpy (tests/test_sim_tinylm_numpy.py checks they agree)."""
    logits = logits.astype(np.float32) / np.float32(temperature)
    if top_k is not None and top_k > 0:
        k = min(top_k, logits.size)
        kth = np.partition(logits, -k)[-k]
        logits = np.where(logits < kth, np.float32(-np.inf), logits)
    e = np.exp(logits - logits.max())
    probs = e / e.sum()
    if top_p < 1:
        order = np.argsort(-probs, kind="stable")
        ranked = probs[order]
        keep = np.cumsum(ranked) - ranked < top_p  # always keeps the most likely
        probs = np.zeros_like(probs)
        probs[order[keep]] = ranked[keep]
    return probs


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One index drawn with weights `probs` (which need not sum to one, as for torch.multinomial)."""
    cumulative = np.cumsum(probs, dtype=np.float64)
    return min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")), probs.size - 1)
