"""The pre-tokenized export: `prepare/tokens.jsonl` with `input_ids` + `loss_mask` per record.

`speculators prepare-data --data <run>/prepare/tokens.jsonl` passes such rows straight through (no
render endpoint, exact tokens the model produced). Written at the end of a completed run from the
durable output, to a temp file renamed into place, so it is either whole or absent.
"""
from __future__ import annotations

import os
from typing import Any

from backend.generate.records import dumps_line, loads, token_row

TOKENS_FILE = "tokens.jsonl"


def export_token_rows(output_path: str, prepare_dir: str) -> dict[str, Any]:
    """Write the export; return what happened (for the summary). Skipped if any record lacks ids."""
    os.makedirs(prepare_dir, exist_ok=True)
    target = os.path.join(prepare_dir, TOKENS_FILE)
    tmp = f"{target}.tmp-{os.getpid()}"
    rows = 0
    try:
        with open(output_path, "rb") as src, open(tmp, "wb") as dst:
            for line in src:
                if not line.endswith(b"\n") or not line.strip():
                    continue
                try:
                    row = token_row(loads(line))
                except (ValueError, TypeError, KeyError):
                    continue
                if row is None:
                    raise LookupError("a record has no token ids")
                dst.write(dumps_line(row))
                rows += 1
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, target)
    except LookupError as exc:
        os.unlink(tmp)
        return {"path": None, "rows": 0, "reason": f"not written: {exc} (server did not return them)"}
    except OSError as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        return {"path": None, "rows": 0, "reason": f"not written: {exc}"}
    return {"path": target, "rows": rows}
