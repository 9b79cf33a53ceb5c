"""Dataset loading and conversation extraction (no server)."""
from __future__ import annotations

import json

import pytest

from backend.kit import dataset as ds

SHAREGPT = {"conversations": [{"from": "system", "value": "Be brief."},
                              {"from": "human", "value": "Hi?"},
                              {"from": "gpt", "value": "Hello."},
                              {"from": "human", "value": "2+2?"},
                              {"from": "gpt", "value": "4"}], "source": "x"}
MESSAGES = {"messages": [{"role": "user", "content": "Name a colour."},
                         {"role": "assistant", "content": "Red."}]}


@pytest.mark.parametrize("row, expected", [
    (SHAREGPT, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]),
    (MESSAGES, [{"role": "user", "content": "Name a colour."}]),
    ({"messages": [{"role": "user", "content": "only a question"}]},
     [{"role": "user", "content": "only a question"}]),
])
def test_extract_keeps_turns_up_to_last_user(row, expected):
    assert ds.extract_prompt(row) == expected


@pytest.mark.parametrize("row, reason", [
    ([1, 2], ds.BAD_NOT_OBJECT),
    ({"text": "no chat"}, ds.BAD_NO_CONVERSATION),
    ({"conversations": []}, ds.BAD_EMPTY),
    ({"conversations": "hello"}, ds.BAD_WRONG_TYPES),
    ({"conversations": ["hello"]}, ds.BAD_WRONG_TYPES),
    ({"conversations": [{"from": "human", "value": 5}]}, ds.BAD_WRONG_TYPES),
    ({"messages": [{"role": None, "content": "x"}]}, ds.BAD_WRONG_TYPES),
    ({"conversations": [{"from": "gpt", "value": "only an answer"}]}, ds.BAD_NO_USER_TURN),
    ({"conversations": [{"from": "human", "value": "   "}]}, ds.BAD_NO_USER_TURN),
    ({"conversations": [{"from": "wizard", "value": "x"}]}, ds.BAD_UNKNOWN_ROLE),
])
def test_bad_rows_have_reasons(row, reason):
    result = ds.extract_prompt(row)
    assert isinstance(result, tuple) and result[0] == reason and result[1]


def test_sample_id_is_stable_and_content_bound():
    a = ds.sample_id(3, SHAREGPT)
    assert a == ds.sample_id(3, json.loads(json.dumps(SHAREGPT)))
    assert a.startswith("00000003-")
    assert a != ds.sample_id(3, MESSAGES) and a != ds.sample_id(4, SHAREGPT)


def _write_jsonl(path, rows, extra_lines=()):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")


def test_jsonl_malformed_rows_counted_not_raised(tmp_path):
    path = tmp_path / "d.jsonl"
    _write_jsonl(path, [SHAREGPT, {"conversations": []}, {"conversations": 7}, MESSAGES],
                 extra_lines=["{not json", "", "[1,2]"])
    items = list(ds.iter_samples(str(path)))
    good = [i for i in items if isinstance(i, ds.Sample)]
    bad = [i for i in items if isinstance(i, ds.BadRow)]
    assert [g.index for g in good] == [0, 3]
    assert ds.count_reasons(bad) == {ds.BAD_EMPTY: 1, ds.BAD_WRONG_TYPES: 1, ds.BAD_INVALID_JSON: 1,
                                     ds.BAD_NOT_OBJECT: 1}
    assert ds.describe(str(path)).rows == 6  # blank lines are not rows


def test_skip_ids_and_limit(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(5)]
    _write_jsonl(path, rows)
    first = [s.sample_id for s in ds.iter_samples(str(path))]
    rest = [s.sample_id for s in ds.iter_samples(str(path), skip_ids=set(first[:2]))]
    assert rest == first[2:]
    assert len(list(ds.iter_samples(str(path), limit=3))) == 3


def test_parquet_and_directory(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pytest.importorskip("datasets")
    table = pa.Table.from_pylist([SHAREGPT, {"conversations": [], "source": "y"}])
    (tmp_path / "sub").mkdir()
    pq.write_table(table, tmp_path / "sub" / "a.parquet")
    _write_jsonl(tmp_path / "b.jsonl", [MESSAGES])
    info = ds.describe(str(tmp_path))
    assert info.rows == 3 and len(info.files) == 2
    items = list(ds.iter_samples(str(tmp_path)))
    good = [i for i in items if isinstance(i, ds.Sample)]
    assert len(good) == 2 and good[1].prompt[-1] == {"role": "user", "content": "2+2?"}  # sorted: b.jsonl first
    assert [b.reason for b in items if isinstance(b, ds.BadRow)] == [ds.BAD_EMPTY]


def test_missing_or_unsupported_path(tmp_path):
    with pytest.raises(ds.DatasetError, match="no such file"):
        ds.data_files(str(tmp_path / "nope"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ds.DatasetError, match="unsupported"):
        ds.data_files(str(tmp_path / "x.csv"))
    with pytest.raises(ds.DatasetError, match="no .parquet"):
        ds.data_files(str(tmp_path))


def test_sample_id_is_the_hash_of_the_canonical_json_and_survives_odd_rows():
    import hashlib

    row = {"conversations": [{"from": "human", "value": "é?"}], "b": 2**70, "a": float("nan")}
    blob = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode()
    assert ds.sample_id(7, row) == f"00000007-{hashlib.sha256(blob).hexdigest()[:12]}"  # ids of older runs hold
    assert ds.sample_id(1, {"s": "\ud800"}) != ds.sample_id(1, {"s": "\ud801"})  # lone surrogates: no crash
