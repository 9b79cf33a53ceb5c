"""The bench's prompts: held-out prompts from the generated data, the same ones for every server.

From a prepare run (`--input-run`): the generation run it read, restricted to the rows the prepare stage
held out (its split.json), which the drafter never trained on. From a generate run: all its prompts,
marked as not held out. From a file (`--prompts`): generation records (output.jsonl) or chat rows
(`messages` or ShareGPT `conversations`), parquet or json as the generation stage reads them.

The prompt of a row is its turns up to the last user turn (backend/kit/dataset.extract_prompt, the
generation stage's own rule). The selection is deterministic: rows ordered by a hash of (seed, sample id),
the first N taken, so the baseline and the drafter get exactly the same workload. Random tokens are never
used: a drafter accepts almost nothing on them, which says nothing about the operator's traffic.

Output length: by default the median completion length of the selected prompts' own generation records
(`completion_tokens`), so the bench decodes as long as the workload does (8K-token reasoning on the seed
host), never a fixed short cut that would hide how acceptance holds up deep into an answer.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Iterator

from backend.contract.lookup import InputError, completed_run
from backend.contract.runs import read_manifest, run_path
from backend.kit import dataset as ds

MAX_LINE = 64 * 2**20  # a generation record with a long answer is big, but not this big


@dataclass(frozen=True)
class Prompt:
    sample_id: str
    messages: tuple[dict[str, str], ...]
    completion_tokens: int | None = None  # the generation record's answer length, when the row is one


@dataclass(frozen=True)
class Workload:
    prompts: tuple[Prompt, ...]
    source: str  # what the prompts came from, for the manifest and the table
    heldout: bool  # every prompt is one the drafter never trained on

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for p in self.prompts:
            h.update(p.sample_id.encode() + b"\0" + json.dumps(p.messages, sort_keys=True).encode() + b"\0")
        return h.hexdigest()[:16]

    @property
    def median_completion(self) -> int | None:
        """The median answer length of the selected prompts' records (None: no record says)."""
        lengths = sorted(p.completion_tokens for p in self.prompts if p.completion_tokens)
        return lengths[len(lengths) // 2] if lengths else None

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "heldout": self.heldout, "prompts": len(self.prompts), "digest": self.digest,
                "median_completion_tokens": self.median_completion}


def select(rows: list[Prompt], num: int, seed: int) -> tuple[Prompt, ...]:
    order = sorted(rows, key=lambda p: hashlib.sha256(f"{seed}:{p.sample_id}".encode()).hexdigest())
    return tuple(order[:num])


def _record_rows(path: str) -> Iterator[tuple[str | None, Any]]:
    """(the record's own id, row) of a JSONL file; a torn last line (a crash mid-write) is skipped."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if len(line) > MAX_LINE:
                raise InputError(f"{path}: line {n} is over {MAX_LINE // 2**20} MiB")
            if not line.endswith(b"\n") or not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise InputError(f"{path}: line {n} is not JSON ({exc})") from None
            yield (row.get("id") if isinstance(row, dict) and isinstance(row.get("id"), str) else None), row


def _prompts(path: str, keep: set[str] | None = None) -> list[Prompt]:
    out: list[Prompt] = []
    bad: dict[str, int] = {}
    if path.endswith(".jsonl"):
        rows = ((rid or ds.sample_id(i, row), row) for i, (rid, row) in enumerate(_record_rows(path)))
    else:
        rows = ((s.sample_id, s.source) for s in ds.iter_samples(path) if isinstance(s, ds.Sample))
    for sid, row in rows:
        if keep is not None and sid not in keep:
            continue
        turns = ds.extract_prompt(row)
        if isinstance(turns, tuple):
            bad[turns[0]] = bad.get(turns[0], 0) + 1
            continue
        n = row.get("completion_tokens") if isinstance(row, dict) else None
        out.append(Prompt(sid, tuple(turns), n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None))
    if not out:
        why = f" ({', '.join(f'{n} {r}' for r, n in sorted(bad.items()))})" if bad else ""
        raise InputError(f"{path}: no usable prompts{why}")
    return out


def from_file(path: str, num: int, seed: int) -> Workload:
    if not os.path.exists(path):
        raise InputError(f"--prompts {path}: no such file")
    return Workload(select(_prompts(path), num, seed), source=f"file {path}", heldout=False)


def from_run(work_dir: str, run_id: str, num: int, seed: int) -> Workload:
    """Prompts of a completed prepare run's held-out rows, or of a completed generate run."""
    manifest = read_manifest(run_path(work_dir, run_id))
    stage = manifest.stage if manifest else None
    if stage == "prepare":
        prep = completed_run(work_dir, run_id, "prepare")
        gen_id = prep.summary.get("input_run") or (manifest.identity.get("input_run") if manifest else None)
        if not isinstance(gen_id, str):
            raise InputError(f"prepare run {run_id} does not name the generation run it read")
        split_path = prep.output("split")
        try:
            with open(split_path, encoding="utf-8") as f:
                heldout = json.load(f).get("heldout_ids")
        except (OSError, ValueError, AttributeError) as exc:
            raise InputError(f"prepare run {run_id}: cannot read {split_path}: {exc}") from None
        if not isinstance(heldout, list) or not heldout:
            raise InputError(f"prepare run {run_id} held out no rows: the bench needs prompts the drafter never "
                             f"trained on (prepare again with a held-out share, or pass --prompts FILE)")
        gen = completed_run(work_dir, gen_id, "generate")
        rows = _prompts(gen.output("records"), keep={str(i) for i in heldout})
        return Workload(select(rows, num, seed), source=f"prepare run {run_id} held-out rows of {gen_id}",
                        heldout=True)
    if stage == "generate":
        gen = completed_run(work_dir, run_id, "generate")
        return Workload(select(_prompts(gen.output("records")), num, seed), source=f"generate run {run_id}",
                        heldout=False)
    raise InputError(f"run {run_id!r} is {'a ' + stage + ' run' if stage else 'not a run (no manifest)'}: the "
                     f"bench takes its prompts from a prepare run (held-out rows) or a generate run")
