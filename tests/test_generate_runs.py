"""The run directory contract: create, resume, refuse a different run, archive with fresh."""
from __future__ import annotations

import json
import os

import pytest

from backend.contract.runs import (ManifestMismatch, Manifest, RunDirError, compare_manifests, open_run_dir,
                          read_manifest)


def _manifest(**identity):
    base = {"dataset": "/d.parquet", "model": "m", "max_tokens": 8192, "sampling": {"temperature": 0.6}}
    base.update(identity)
    return Manifest(stage="generate", run_id="r1", identity=base)


def test_create_then_resume(tmp_path):
    rd = open_run_dir(str(tmp_path), "r1", _manifest())
    assert not rd.resumed and rd.path == str(tmp_path / "runs" / "r1")
    saved = json.loads((tmp_path / "runs" / "r1" / "manifest.json").read_text())
    assert saved["config_hash"] == _manifest().config_hash and saved["identity"]["model"] == "m"
    again = open_run_dir(str(tmp_path), "r1", _manifest())
    assert again.resumed and again.manifest.config_hash == rd.manifest.config_hash


def test_mismatch_refused_with_clear_message(tmp_path):
    open_run_dir(str(tmp_path), "r1", _manifest())
    with pytest.raises(ManifestMismatch) as info:
        open_run_dir(str(tmp_path), "r1", _manifest(model="other", sampling={"temperature": 1.0}))
    text = str(info.value)
    assert "model was \"m\", now \"other\"" in text and "sampling was" in text and "--fresh" in text


def test_fresh_archives_instead_of_deleting(tmp_path):
    rd = open_run_dir(str(tmp_path), "r1", _manifest())
    (tmp_path / "runs" / "r1" / "output.jsonl").write_text("{}\n")
    new = open_run_dir(str(tmp_path), "r1", _manifest(model="other"), fresh=True)
    assert new.archived and os.path.basename(new.archived).startswith("r1.archived-")
    assert open(os.path.join(new.archived, "output.jsonl")).read() == "{}\n"
    assert read_manifest(new.path).identity["model"] == "other"
    assert not os.path.exists(os.path.join(new.path, "output.jsonl"))
    assert rd.path == new.path


def test_unusable_dirs(tmp_path):
    with pytest.raises(RunDirError, match="expected letters, digits"):
        open_run_dir(str(tmp_path), "../x", _manifest())
    stray = tmp_path / "runs" / "r1"
    stray.mkdir(parents=True)
    (stray / "something").write_text("x")
    with pytest.raises(RunDirError, match="no manifest.json"):
        open_run_dir(str(tmp_path), "r1", _manifest())
    (stray / "manifest.json").write_text("{broken")
    with pytest.raises(RunDirError, match="not valid JSON"):
        open_run_dir(str(tmp_path), "r1", _manifest())


def test_compare_ignores_nothing_in_identity():
    assert compare_manifests(_manifest(), _manifest()) == []
    assert compare_manifests(_manifest(), _manifest(extra=1)) == ["extra was null, now 1"]
