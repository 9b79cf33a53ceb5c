"""Prompts drawn from several datasets, each with a count or a share, sampled with a seed.

`--sources '[{"name": "chat", "dataset": "/d/chat.jsonl", "count": 600},
             {"name": "code", "dataset": "/d/code", "share": 0.25}]' --sample-total 800 --selection-seed 7`

A source takes exactly `count` rows, or its `share` of `--sample-total` (shares are rounded by largest
remainder, so the counts add up to the total exactly; counts and shares may be mixed, the shares then
divide what the counts leave). Which rows: a seeded sample of the source's row positions
(random.Random seeded with the selection seed and the source's name), so the same settings pick the same
rows on a resume or in a second run; changing the seed, a count or a dataset file changes the run's
identity (the manifest records every source's files, count and a digest of the chosen positions), and a
resume with other settings is refused.

Sample ids are `<source name>.<the dataset's own sample id>`: unique across sources, and the per-source
counts of done samples are read off them.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from backend.kit import dataset as ds

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
SEPARATOR = "."


class SourceError(ValueError):
    """A source list that cannot be used; one line says which source and what was expected."""


@dataclass(frozen=True)
class SourceSpec:
    name: str
    dataset: str
    count: int | None = None
    share: float | None = None


@dataclass
class ChosenSource:
    spec: SourceSpec
    info: ds.DatasetInfo
    positions: list[int] = field(default_factory=list)  # sorted row positions in the dataset

    @property
    def digest(self) -> str:
        return hashlib.sha256(",".join(map(str, self.positions)).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.spec.name, "dataset": self.info.path, "files": self.info.files, "rows": self.info.rows,
                "count": len(self.positions), "share": self.spec.share, "positions_digest": self.digest}


@dataclass
class Selection:
    seed: int
    sources: list[ChosenSource]

    @property
    def total(self) -> int:
        return sum(len(s.positions) for s in self.sources)

    def identity(self) -> dict[str, Any]:
        return {"selection_seed": self.seed, "sources": [s.to_dict() for s in self.sources]}

    def counts(self) -> dict[str, int]:
        return {s.spec.name: len(s.positions) for s in self.sources}

    def iter_samples(self) -> Iterator[ds.Sample | ds.BadRow]:
        """The chosen rows, source by source in row order; `index` runs over the whole selection."""
        n = 0
        for source in self.sources:
            wanted = set(source.positions)
            if not wanted:
                continue
            last = source.positions[-1]
            for index, row in enumerate(ds.raw_rows(source.spec.dataset)):
                if index > last:
                    break
                if index not in wanted:
                    continue
                if isinstance(row, ds._Unparsable):  # noqa: SLF001 - the dataset module's own marker
                    yield ds.BadRow(n, ds.BAD_INVALID_JSON, row.error)
                else:
                    prompt = ds.extract_prompt(row)
                    if isinstance(prompt, tuple):
                        yield ds.BadRow(n, prompt[0], prompt[1])
                    else:
                        yield ds.Sample(index=n, sample_id=f"{source.spec.name}{SEPARATOR}{ds.sample_id(index, row)}",
                                        prompt=prompt, source=row)
                n += 1


def parse(value: Any) -> list[SourceSpec]:
    """The --sources list, checked (pure: no file is read)."""
    if not isinstance(value, list) or not value:
        raise SourceError("--sources: expected a non-empty JSON list of {name, dataset, count | share}")
    specs, names = [], set()
    for i, item in enumerate(value):
        where = f"--sources[{i}]"
        if not isinstance(item, dict):
            raise SourceError(f"{where}: expected an object with name, dataset and count or share")
        unknown = set(item) - {"name", "dataset", "count", "share"}
        if unknown:
            raise SourceError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (name, dataset, count, share)")
        name, dataset = item.get("name"), item.get("dataset")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise SourceError(f"{where}: name must be letters, digits, '_' or '-' (at most 32), got {name!r}")
        if name in names:
            raise SourceError(f"{where}: the name {name!r} is used twice")
        names.add(name)
        if not isinstance(dataset, str) or not dataset:
            raise SourceError(f"{where} ({name}): dataset must be a local file or directory")
        count, share = item.get("count"), item.get("share")
        if (count is None) == (share is None):
            raise SourceError(f"{where} ({name}): give exactly one of count and share")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            raise SourceError(f"{where} ({name}): count must be an integer >= 0, got {count!r}")
        if share is not None and (not isinstance(share, (int, float)) or isinstance(share, bool)
                                  or not 0 < share <= 1):
            raise SourceError(f"{where} ({name}): share must be in (0, 1], got {share!r}")
        specs.append(SourceSpec(name, dataset, count, float(share) if share is not None else None))
    shares = sum(s.share or 0.0 for s in specs)
    if shares > 1 + 1e-9:
        raise SourceError(f"--sources: the shares add up to {shares:g}, more than 1")
    return specs


def counts_for(specs: list[SourceSpec], total: int | None) -> list[int]:
    """Each source's row count: counts as given, shares of what `total` leaves after them, rounded by
    largest remainder so that the shares' counts add up exactly (pure)."""
    fixed = sum(s.count or 0 for s in specs)
    shared = [s for s in specs if s.share is not None]
    if not shared:
        if total is not None and total != fixed:
            raise SourceError(f"--sample-total {total} differs from the sources' counts, which add up to {fixed}")
        return [s.count or 0 for s in specs]
    if total is None:
        raise SourceError("--sources with a share needs --sample-total (the number of samples to draw)")
    left = total - fixed
    if left < 0:
        raise SourceError(f"--sample-total {total} is below the sources' counts ({fixed})")
    weight = sum(s.share or 0.0 for s in shared)
    exact = {s.name: left * (s.share or 0.0) / weight for s in shared}
    out = {name: int(v) for name, v in exact.items()}
    rest = left - sum(out.values())
    for name in sorted(exact, key=lambda n: (-(exact[n] - out[n]), n))[:rest]:
        out[name] += 1
    return [s.count if s.count is not None else out[s.name] for s in specs]


def choose(specs: list[SourceSpec], counts: list[int], rows: list[int], seed: int) -> list[list[int]]:
    """The seeded row positions of each source (pure): `counts[i]` of `range(rows[i])`, sorted."""
    chosen = []
    for spec, want, have in zip(specs, counts, rows):
        if want > have:
            raise SourceError(f"source {spec.name}: {want} rows asked for, its dataset {spec.dataset} has {have}")
        rng = random.Random(f"{seed}:{spec.name}")
        chosen.append(sorted(rng.sample(range(have), want)))
    return chosen


def plan(value: Any, total: int | None, seed: int) -> Selection:
    """Parse, count each source's rows, and choose (the dataset files are read here)."""
    specs = parse(value)
    counts = counts_for(specs, total)
    infos = []
    for spec in specs:
        try:
            infos.append(ds.describe(spec.dataset))
        except ds.DatasetError as exc:
            raise SourceError(f"source {spec.name}: {exc}") from None
    positions = choose(specs, counts, [i.rows for i in infos], seed)
    return Selection(seed=seed, sources=[ChosenSource(s, i, p) for s, i, p in zip(specs, infos, positions)])


def source_of(sample_id: str) -> str:
    return sample_id.split(SEPARATOR, 1)[0]


def done_by_source(done_ids: Iterable[str], selection: Selection) -> dict[str, int]:
    out = {s.spec.name: 0 for s in selection.sources}
    for sid in done_ids:
        name = source_of(sid)
        if name in out:
            out[name] += 1
    return out


def parse_json(text: str) -> list[Any]:
    value = json.loads(text)
    if not isinstance(value, list):
        raise ValueError("expected a JSON list")
    return value
