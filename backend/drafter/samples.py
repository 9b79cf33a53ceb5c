"""Held-out rows with their hidden states, as speculators' own dataset reads them (verify's samples, and
the fixed subset the train stage measures each checkpoint on: backend/train/selection.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator


def heldout_items(data: str, hidden_states: str | None, limit: int, *, endpoint: str | None = None,
                  model: str | None = None, cache_dir: str | None = None) -> Iterator[dict[str, Any]]:
    """The first `limit` rows of the prepared dataset `data`, hidden states from `hidden_states` (or fetched
    from the extraction server at `endpoint`, serving `model`, into `cache_dir`), float32."""
    import torch
    from hs_connectors.transfer import FileTransfer
    from speculators.train.data import ArrowDataset

    transfer = FileTransfer(Path(hidden_states or cache_dir or os.path.join(data, "hs-cache")))
    dataset = ArrowDataset(max_len=1 << 30, datapath=data, transfer=transfer,
                           vllm_endpoint=endpoint or "http://127.0.0.1:8000/v1",
                           on_missing="raise" if endpoint is None else "generate", train_ratio=1.0,
                           hidden_states_dtype=torch.float32, model=model if endpoint else None)
    for i in range(min(limit, len(dataset))):
        item = dataset[i]
        if isinstance(item, dict):
            yield {k: (v.float() if k in ("hidden_states", "verifier_last_hidden_states") else v)
                   for k, v in item.items()}
