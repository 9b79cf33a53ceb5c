"""Checkpoints as published drafters ship them, for the fetch-drafter tests: an EAGLE-3 drafter in the
original (EAGLE / SpecForge) layout for the demo's tiny verifier, as its files (name -> bytes)."""
from __future__ import annotations

import json
from pathlib import Path

DRAFT_VOCAB = 256


def original_eagle3_files(verifier: Path, *, aux_layer_ids: list[int] | None = (0, 1, 2), seed: int = 0,
                          ) -> dict[str, bytes]:
    """config.json (llama-style, `LlamaForCausalLMEagle3`) and model.safetensors with `midlayer.*`
    weights, fc over three aux layers, a reduced draft vocabulary with its d2t/t2d mapping."""
    import torch
    from safetensors.torch import save

    v = json.loads((verifier / "config.json").read_text())
    v = v.get("text_config", v)
    hidden, vocab, heads, kv = v["hidden_size"], v["vocab_size"], v["num_attention_heads"], v["num_key_value_heads"]
    inter = v["intermediate_size"]
    head_dim = v.get("head_dim") or hidden // heads
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    kept = torch.sort(torch.randperm(vocab, generator=g)[:DRAFT_VOCAB]).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    tensors = {
        "fc.weight": w(hidden, 3 * hidden),
        "midlayer.input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        "midlayer.hidden_norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        "midlayer.self_attn.q_proj.weight": w(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": w(kv * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": w(kv * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": w(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": w(inter, hidden),
        "midlayer.mlp.up_proj.weight": w(inter, hidden),
        "midlayer.mlp.down_proj.weight": w(hidden, inter),
        "norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        "lm_head.weight": w(DRAFT_VOCAB, hidden),
        "d2t": kept - torch.arange(DRAFT_VOCAB),
        "t2d": t2d,
    }
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
              "num_hidden_layers": 1, "head_dim": head_dim, "vocab_size": vocab, "draft_vocab_size": DRAFT_VOCAB,
              "hidden_act": "silu", "rms_norm_eps": v.get("rms_norm_eps", 1e-6),
              "rope_theta": v.get("rope_theta", 10000.0), "max_position_embeddings": 2048,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    if aux_layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)}
    return {"config.json": json.dumps(config, indent=2).encode(), "model.safetensors": save(tensors)}
