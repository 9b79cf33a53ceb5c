"""Input rows -> prompt conversations, with bad rows counted by reason instead of raised.

Accepted shapes: ShareGPT (`conversations: [{from, value}]`, as open-perfectblend) and chat
(`messages: [{role, content}]`). A sample is the turns up to and including the LAST user turn: the
dataset's own answer after it is dropped because the target model writes its own.

Files: parquet and json go through `datasets` (streaming, so memory stays flat); jsonl is read line by
line here because `datasets` aborts a whole file on one unparsable line, and the issue asks for bad
rows to be counted and skipped.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

SUFFIXES = (".parquet", ".jsonl", ".json")

# Reasons a row is skipped (keys of the `skipped` counter in progress events and the summary).
BAD_NOT_OBJECT = "not_an_object"
BAD_INVALID_JSON = "invalid_json"
BAD_NO_CONVERSATION = "no_conversation"
BAD_EMPTY = "empty_conversation"
BAD_WRONG_TYPES = "wrong_types"
BAD_UNKNOWN_ROLE = "unknown_role"
BAD_NO_USER_TURN = "no_user_turn"

_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "model": "assistant", "chatgpt": "assistant",
    "bing": "assistant", "bard": "assistant",
    "system": "system",
}


class DatasetError(Exception):
    """The dataset cannot be read at all (missing path, no data files, a corrupt file); one line to act on."""


@dataclass(frozen=True)
class Sample:
    index: int  # position in the dataset (all files in sorted order)
    sample_id: str
    prompt: list[dict[str, str]]  # {role, content}, ends with a user turn
    source: dict[str, Any]  # the original row, as loaded


@dataclass(frozen=True)
class BadRow:
    index: int
    reason: str
    detail: str


@dataclass
class DatasetInfo:
    path: str
    files: list[dict[str, Any]] = field(default_factory=list)  # {path, size, mtime_ns}
    rows: int = 0


def data_files(path: str) -> list[str]:
    """The data files behind `path` (a file, or a directory searched recursively), sorted."""
    if os.path.isfile(path):
        if not path.endswith(SUFFIXES):
            raise DatasetError(f"{path}: unsupported file type; use one of {', '.join(SUFFIXES)}")
        return [path]
    if os.path.isdir(path):
        found = []
        for root, _dirs, names in os.walk(path):
            found.extend(os.path.join(root, n) for n in names if n.endswith(SUFFIXES))
        if not found:
            raise DatasetError(f"{path}: no {'/'.join(SUFFIXES)} files in this directory")
        return sorted(found)
    raise DatasetError(f"{path}: no such file or directory (pass --dataset a local file or directory)")


def describe(path: str) -> DatasetInfo:
    """Identity of the dataset for the manifest (sizes, mtimes) and its row count."""
    info = DatasetInfo(path=os.path.abspath(path))
    for name in data_files(path):
        st = os.stat(name)
        info.files.append({"path": os.path.abspath(name), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        info.rows += count_rows(name)
    return info


def count_rows(name: str) -> int:
    try:
        if name.endswith(".jsonl"):
            with open(name, "rb") as f:
                return sum(1 for line in f if line.strip())
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.ParquetFile(name).metadata.num_rows
        return sum(1 for _ in _datasets_rows(name))
    except DatasetError:
        raise
    except Exception as exc:  # pyarrow and datasets raise many types, with pages of traceback
        raise DatasetError(unreadable(name, exc)) from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def unreadable(name: str, exc: BaseException) -> str:
    """One line saying which file cannot be read and why (for JSON, where: the first bad line)."""
    if isinstance(exc, OSError) and not type(exc).__module__.startswith("pyarrow"):
        return f"{name}: cannot read it ({exc.strerror or _first_line(exc)})"
    if name.endswith(".parquet"):
        return f"{name}: not a readable parquet file ({_first_line(exc)})"
    where = json_syntax_error(name)
    if where:
        return f"{name}: {where}"
    return f"{name}: cannot be read as JSON rows ({_first_line(exc)})"


def json_syntax_error(name: str, max_document: int = 1 << 30) -> str | None:
    """Where a .json file stops being JSON: `line L column C: <what>`, or None when its syntax is fine.

    A file that opens with `[` is one document (an array of rows); anything else is read as one row
    per line, as `datasets` reads it.
    """
    try:
        with open(name, "rb") as f:
            head = f.read(4096).lstrip()
            f.seek(0)
            if head.startswith(b"["):
                if os.fstat(f.fileno()).st_size > max_document:
                    return None
                try:
                    json.loads(f.read())
                except ValueError as exc:
                    return _json_where(exc, 0)
                return None
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    json.loads(line)
                except ValueError as exc:
                    return _json_where(exc, number)
    except OSError:
        return None
    return None


def _json_where(exc: ValueError, line: int) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"line {line or exc.lineno} column {exc.colno}: not valid JSON ({exc.msg})"
    return f"line {line}: not valid JSON ({_first_line(exc)})" if line else f"not valid JSON ({_first_line(exc)})"


def _datasets_rows(name: str) -> Iterator[Any]:
    import datasets

    # the stage reports a bad file in one line itself (unreadable): keep datasets' own log and bars quiet
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)
    datasets.disable_progress_bars()
    kind = "parquet" if name.endswith(".parquet") else "json"
    yield from datasets.load_dataset(kind, data_files=name, split="train", streaming=True)


def _jsonl_rows(name: str) -> Iterator[Any]:
    """Yield each line's value, or a BadRow-marker tuple for a line that is not JSON."""
    with open(name, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            # json, not orjson: orjson 3.8 turns ints over 64 bits into floats, which would change the
            # row, hence its sample id, between backend versions (a resume would redo those samples)
            try:
                yield json.loads(line)
            except ValueError as exc:
                yield _Unparsable(str(exc))


@dataclass(frozen=True)
class _Unparsable:
    error: str


def raw_rows(path: str) -> Iterator[Any]:
    for name in data_files(path):
        rows = _jsonl_rows(name) if name.endswith(".jsonl") else _datasets_rows(name)
        try:
            yield from rows
        except DatasetError:
            raise
        except Exception as exc:  # a file that breaks mid-way: one line, not a traceback
            raise DatasetError(unreadable(name, exc)) from None


# What json.dumps(row, sort_keys=True, ensure_ascii=False, default=str) builds on every call; one
# instance gives the same text without constructing an encoder per row.
_ID_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str)


def sample_id(index: int, row: Any) -> str:
    """Stable across restarts: the row's position plus a hash of its content, so a changed row
    never matches an old record (the manifest already refuses a changed dataset)."""
    blob = _ID_ENCODER.encode(row).encode("utf-8", "surrogatepass")  # a lone surrogate must not crash
    return f"{index:08d}-{hashlib.sha256(blob).hexdigest()[:12]}"


def extract_prompt(row: Any) -> list[dict[str, str]] | tuple[str, str]:
    """The prompt turns of one row, or (reason, detail) when the row is unusable. Pure."""
    if not isinstance(row, dict):
        return BAD_NOT_OBJECT, f"row is {type(row).__name__}, expected an object"
    turns = row.get("conversations")
    key = "conversations"
    if turns is None:
        turns, key = row.get("messages"), "messages"
    if turns is None:
        return BAD_NO_CONVERSATION, "no `conversations` or `messages` field"
    if not isinstance(turns, list):
        return BAD_WRONG_TYPES, f"`{key}` is {type(turns).__name__}, expected a list"
    if not turns:
        return BAD_EMPTY, f"`{key}` is empty"
    out: list[dict[str, str]] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return BAD_WRONG_TYPES, f"turn {i} is {type(turn).__name__}, expected an object"
        role = turn.get("from", turn.get("role"))
        content = turn.get("value", turn.get("content"))
        if not isinstance(role, str):
            return BAD_WRONG_TYPES, f"turn {i} role is {type(role).__name__}, expected a string"
        if not isinstance(content, str):
            return BAD_WRONG_TYPES, f"turn {i} content is {type(content).__name__}, expected a string"
        norm = _ROLES.get(role.strip().lower())
        if norm is None:
            if role.strip().lower() == "tool":
                continue  # tool results cannot be replayed without the call; drop them
            return BAD_UNKNOWN_ROLE, f"turn {i} has role {role!r}"
        out.append({"role": norm, "content": content})
    last_user = max((i for i, t in enumerate(out) if t["role"] == "user" and t["content"].strip()),
                    default=-1)
    if last_user < 0:
        return BAD_NO_USER_TURN, "no non-empty user turn"
    return out[: last_user + 1]


def iter_samples(path: str, skip_ids: set[str] | None = None,
                 limit: int | None = None) -> Iterator[Sample | BadRow]:
    """Samples in dataset order; bad rows come out as BadRow so the caller counts them.

    `limit` caps the number of dataset rows considered (good or bad), so a capped run covers a
    fixed prefix of the dataset whatever was already done.
    """
    for index, row in enumerate(raw_rows(path)):
        if limit is not None and index >= limit:
            return
        if isinstance(row, _Unparsable):
            yield BadRow(index, BAD_INVALID_JSON, row.error)
            continue
        prompt = extract_prompt(row)
        if isinstance(prompt, tuple):
            yield BadRow(index, prompt[0], prompt[1])
            continue
        sid = sample_id(index, row)
        if skip_ids is not None and sid in skip_ids:
            continue
        yield Sample(index=index, sample_id=sid, prompt=prompt, source=row)


def count_reasons(items: list[BadRow]) -> dict[str, int]:
    return dict(Counter(b.reason for b in items))
