"""The fetch-drafter stage against a Hub stand-in on loopback: a cut download resumes with a Range request
and ends byte-identical, every file is checked against the Hub's hash, bad repos get clear errors, the
token never leaks, and an original-layout EAGLE-3 drafter is converted into a checkpoint the verify stage
accepts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.contract.events import parse_events
from harness.drafter_support import run_stage, stage_env, tiny_verifier
from harness.fake_hub import FakeHub, HubServer, Repo
from harness.hub_support import original_eagle3_files
from harness.train_support import LAYERS, Dataset, completed_run

MIB = 2**20
# huggingface_hub reads a response in 10 MiB chunks: a cut keeps whole chunks, so the big file spans three
BIG = 24 * MIB + 17
CUT = 15 * MIB
SPEC_CONFIG = json.dumps({"speculators_model_type": "eagle3", "speculators_config": {"algorithm": "eagle3"}}).encode()


def fetch(work: Path, hub_url: str, *args: str, env_extra: dict[str, str] | None = None,
          tmp_path_factory=None, run_id: str = "fetch") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "PYTHONUNBUFFERED": "1",
           "HF_HUB_OFFLINE": "0", "HF_HOME": str(work / "hf-home"), **(env_extra or {})}
    env.pop("HF_TOKEN", None) if "HF_TOKEN" not in (env_extra or {}) else None
    if tmp_path_factory is not None:
        env = {**stage_env(tmp_path_factory), **env}
    return run_stage("backend.fetch_drafter", "--work-dir", str(work), "--run-id", run_id, "--endpoint", hub_url,
                     *args, env=env, timeout=300)


def events(work: Path, run_id: str = "fetch") -> list:
    evs, _ = parse_events((work / "runs" / run_id / "events.jsonl").read_bytes())
    return evs


def finish(work: Path, run_id: str = "fetch") -> dict:
    return [e for e in events(work, run_id) if e.kind == "finish"][-1].data


@pytest.fixture
def big_repo() -> tuple[FakeHub, bytes]:
    data = os.urandom(BIG)
    hub = FakeHub(repos={"community/kimi-eagle3": Repo(files={"config.json": SPEC_CONFIG, "model.safetensors": data,
                                                              "README.md": b"# a drafter\n", "chart.png": b"png",
                                                              "optimizer.bin": b"o" * 4096})})
    return hub, data


def test_download_cut_midway_resumes_where_it_stopped(tmp_path, big_repo):
    hub, data = big_repo
    with HubServer(hub) as server:
        hub.cut("model.safetensors", CUT)
        first = fetch(tmp_path, server.url, "--repo", "community/kimi-eagle3")
        assert first.returncode == 1, first.stderr
        assert "partial file is kept: run again to resume" in first.stderr
        commit = hub.repos["community/kimi-eagle3"].commit
        target = tmp_path / "drafters" / "community--kimi-eagle3" / commit
        part = target / "model.safetensors.part"
        kept = part.stat().st_size
        assert 0 < kept < BIG and part.read_bytes() == data[:kept]
        assert not (target / "model.safetensors").exists()
        ended = finish(tmp_path)
        assert ended["status"] == "failed" and "community/kimi-eagle3/model.safetensors" in ended["summary"]["error"]

        hub.available = True
        gets_before = len(hub.gets("model.safetensors"))
        second = fetch(tmp_path, server.url, "--repo", "community/kimi-eagle3")
        assert second.returncode == 0, second.stderr
        resumed = hub.gets("model.safetensors")[gets_before:]
        assert len(resumed) == 1 and resumed[0].headers.get("range") == f"bytes={kept}-"
        assert (target / "model.safetensors").read_bytes() == data
        assert not part.exists()
        summary = finish(tmp_path)["summary"]
        assert summary["transfer"]["model.safetensors"] == "resumed"
        assert summary["fetched_bytes"] == BIG - kept
        assert summary["skipped_files"] == ["chart.png", "optimizer.bin"]
        assert summary["outputs"]["checkpoint"] == str(target) and summary["converted"] is False
        progress = [e.data for e in events(tmp_path) if e.kind == "progress"]
        assert all(p["phase"] == "download" and p["total"] == BIG + len(SPEC_CONFIG) + 12 for p in progress)
        assert progress[-1]["done"] == progress[-1]["total"] and progress[-1]["files_done"] == 3

        # a finished download is never fetched again, whatever the run
        gets_before = len(hub.gets("model.safetensors"))
        third = fetch(tmp_path, server.url, "--repo", "community/kimi-eagle3", run_id="fetch-again")
        assert third.returncode == 0, third.stderr
        assert len(hub.gets("model.safetensors")) == gets_before
        assert set(finish(tmp_path, "fetch-again")["summary"]["transfer"].values()) == {"present"}


def test_a_stopped_download_keeps_its_partial_file_and_resumes(tmp_path, big_repo):
    """SIGTERM (the console's stop) mid-download: the run finishes as stopped, the bytes on disk stay."""
    import signal
    import time

    hub, data = big_repo
    hub.slow["model.safetensors"] = 0.25
    commit = hub.repos["community/kimi-eagle3"].commit
    part = tmp_path / "drafters" / "community--kimi-eagle3" / commit / "model.safetensors.part"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_TOKEN", None)
    with HubServer(hub) as server:
        proc = subprocess.Popen([sys.executable, "-m", "backend.fetch_drafter",
                                 "--work-dir", str(tmp_path), "--run-id", "fetch", "--endpoint", server.url,
                                 "--repo", "community/kimi-eagle3"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size >= 10 * MIB):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err  # a stop is not a failure (backend/contract/exitcodes.py)
        ended = finish(tmp_path)
        assert ended["status"] == "stopped" and "run again to resume" in ended["summary"]["error"]
        kept = part.stat().st_size
        assert kept >= 10 * MIB and part.read_bytes() == data[:kept]

        del hub.slow["model.safetensors"]
        again = fetch(tmp_path, server.url, "--repo", "community/kimi-eagle3")
        assert again.returncode == 0, again.stderr
        assert hub.gets("model.safetensors")[-1].headers.get("range") == f"bytes={kept}-"
        assert (part.parent / "model.safetensors").read_bytes() == data


def test_partial_file_that_is_not_a_prefix_is_caught_by_the_hash(tmp_path, big_repo):
    hub, data = big_repo
    commit = hub.repos["community/kimi-eagle3"].commit
    target = tmp_path / "drafters" / "community--kimi-eagle3" / commit
    target.mkdir(parents=True)
    (target / "model.safetensors.part").write_bytes(b"\0" * MIB)  # left by something else
    with HubServer(hub) as server:
        bad = fetch(tmp_path, server.url, "--repo", "community/kimi-eagle3")
        assert bad.returncode == 1
        assert "do not match the Hub's sha256" in bad.stderr and "run again to download it afresh" in bad.stderr
        assert not (target / "model.safetensors.part").exists() and not (target / "model.safetensors").exists()
        good = fetch(tmp_path, server.url, "--repo", "community/kimi-eagle3")
        assert good.returncode == 0, good.stderr
        assert (target / "model.safetensors").read_bytes() == data


def test_unknown_repo_and_revision_are_named(tmp_path):
    hub = FakeHub(repos={"community/small": Repo(files={"config.json": SPEC_CONFIG})})
    with HubServer(hub) as server:
        res = fetch(tmp_path, server.url, "--repo", "community/no-such-drafter")
        assert res.returncode == 1
        assert "no model repo 'community/no-such-drafter'" in res.stderr and server.url in res.stderr
        ended = finish(tmp_path)
        assert ended["status"] == "failed" and "community/no-such-drafter" in ended["summary"]["error"]
        res = fetch(tmp_path, server.url, "--repo", "community/small", "--revision", "v9", run_id="rev")
        assert res.returncode == 1 and "community/small has no revision 'v9'" in res.stderr


def test_repo_without_config_json_says_so(tmp_path):
    hub = FakeHub(repos={"community/weights-only": Repo(files={"model.safetensors": b"x" * 2000, "README.md": b"hi"})})
    with HubServer(hub) as server:
        res = fetch(tmp_path, server.url, "--repo", "community/weights-only")
    assert res.returncode == 1
    assert "community/weights-only at main has no config.json" in res.stderr
    assert not any(r.path.endswith("/model.safetensors") for r in hub.requests)  # nothing downloaded in vain


@pytest.mark.parametrize("repo", ["community/x\n", "../etc", "a/b/c", "community/--x", "/abs", "community/x.git",
                                  "-rf/x", "ümlaut/x"])
def test_bad_repo_ids_are_refused_before_anything_is_written(tmp_path, repo):
    res = run_stage("backend.fetch_drafter", "--work-dir", str(tmp_path), f"--repo={repo}",
                    env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert res.returncode == 2 and "--repo" in res.stderr and "owner/name" in res.stderr
    assert not (tmp_path / "runs").exists()


def test_token_is_sent_to_the_hub_and_written_nowhere(tmp_path):
    secret = "hf_s3cretTokenValue0123456789"
    hub = FakeHub(repos={"community/private": Repo(files={"config.json": SPEC_CONFIG})})
    token_file = tmp_path / "token"
    token_file.write_text(secret + "\n")
    with HubServer(hub) as server:
        res = fetch(tmp_path / "w1", server.url, "--repo", "community/private", "--token-file", str(token_file))
        assert res.returncode == 0, res.stderr
        res2 = fetch(tmp_path / "w2", server.url, "--repo", "community/private", env_extra={"HF_TOKEN": secret})
        assert res2.returncode == 0, res2.stderr
    assert hub.requests and all(r.headers.get("authorization") == f"Bearer {secret}" for r in hub.requests)
    for out in (res.stdout, res.stderr, res2.stdout, res2.stderr):
        assert secret not in out
    for path in (tmp_path / "w1" / "runs").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_original_eagle3_layout_is_converted_into_a_checkpoint_verify_accepts(tmp_path, tmp_path_factory):
    verifier = tiny_verifier(tmp_path_factory)
    hub = FakeHub(repos={"community/tiny-eagle3": Repo(files=original_eagle3_files(verifier, aux_layer_ids=LAYERS))})
    with HubServer(hub) as server:
        unconverted = fetch(tmp_path, server.url, "--repo", "community/tiny-eagle3", run_id="nov",
                            tmp_path_factory=tmp_path_factory)
        assert unconverted.returncode == 1
        assert "not in speculators format" in unconverted.stderr and "pass --verifier" in unconverted.stderr
        res = fetch(tmp_path, server.url, "--repo", "community/tiny-eagle3", "--verifier", str(verifier),
                    tmp_path_factory=tmp_path_factory)
    assert res.returncode == 0, res.stderr
    summary = finish(tmp_path)["summary"]
    ckpt = summary["outputs"]["checkpoint"]
    assert summary["converted"] is True and summary["format"] == "eagle3-original"
    assert ckpt == str(tmp_path / "runs" / "fetch" / "checkpoint") and summary["aux_layer_ids"] == LAYERS
    assert any(e.kind == "progress" and e.data.get("phase") == "convert" for e in events(tmp_path))
    source = json.loads(Path(ckpt, "fetched_from.json").read_text())
    assert source["repo"] == "community/tiny-eagle3" and source["commit"] == summary["commit"]

    # the verify stage takes it as it takes ours: on a train run's held-out rows, next to an untrained draft
    data = Dataset(tmp_path / "data", verifier, train=2, heldout=4)
    completed_run(tmp_path, "train", "train-1", {"heldout_data": str(data.heldout_data),
                                                 "heldout_hidden_states": str(data.heldout_hs),
                                                 "checkpoint": str(tmp_path / "ours")},
                  verifier=str(verifier), speculative_tokens=3)
    done = run_stage("backend.verify", "--work-dir", str(tmp_path), "--input-run", "train-1", "--run-id", "v3",
                     "--checkpoint", ckpt, "--samples", "4", env=stage_env(tmp_path_factory))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    verified = json.loads((tmp_path / "runs" / "v3" / "verify.json").read_text())
    assert verified["ok"] and verified["checkpoint"] == ckpt
    assert {c["name"]: c["ok"] for c in verified["checks"]} == {
        "speculators_format": True, "aux_layer_ids": True, "draft_vocab": True, "verifier": True, "weights_load": True}
    vocab = json.loads((verifier / "config.json").read_text())["vocab_size"]
    assert f"256 of {vocab} tokens" in next(c["detail"] for c in verified["checks"] if c["name"] == "draft_vocab")
    assert verified["acceptance"]["trained"]["samples"] == 4


def test_listing_names_that_could_escape_the_download_dir_are_refused():
    from backend.fetch_drafter.download import safe_repo_path

    for ok in ("config.json", "sub/model.safetensors", "a.b/c-d_e.json"):
        assert safe_repo_path(ok) == ok
    for bad in ("../x", "/etc/passwd", "a//b", "a/./b", "a/../../b", "x\n", "a\\b", "", "m.safetensors.part",
                ".fetch.lock", None, 7):
        assert safe_repo_path(bad) is None, bad


def test_a_download_that_cannot_fit_is_refused_before_a_byte_is_written(tmp_path):
    from backend.fetch_drafter.download import HubError, Listing, RemoteFile, check_space

    listing = Listing("community/huge", "main", "0" * 40, (RemoteFile("model.safetensors", 10**16),), ())
    with pytest.raises(HubError, match=r"community/huge needs 9313225\.75 GiB more in .* only .* GiB are free"):
        check_space(listing, str(tmp_path))


# -- the shared download folder is not trusted (issue 23) -----------------------------------------------

REPO_ID = "community/kimi-eagle3"


def target_of(tmp_path: Path, hub: FakeHub) -> Path:
    return tmp_path / "drafters" / "community--kimi-eagle3" / hub.repos[REPO_ID].commit


def test_a_file_at_its_final_name_is_hashed_before_it_is_kept(tmp_path, big_repo):
    hub, data = big_repo
    target = target_of(tmp_path, hub)
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"\0" * len(data))  # the listed size, not the content
    with HubServer(hub) as server:
        res = fetch(tmp_path, server.url, "--repo", REPO_ID)
    assert res.returncode == 0, res.stderr
    assert (target / "model.safetensors").read_bytes() == data
    assert finish(tmp_path)["summary"]["transfer"]["model.safetensors"] == "fetched"


def test_a_planted_link_in_the_download_folder_is_never_followed(tmp_path, big_repo):
    hub, _ = big_repo
    target = target_of(tmp_path, hub)
    target.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (target / "model.safetensors.part").symlink_to(victim)
    with HubServer(hub) as server:
        res = fetch(tmp_path, server.url, "--repo", REPO_ID)
    assert res.returncode == 1 and "is a symbolic link" in res.stderr
    assert victim.read_bytes() == b"precious"
    (target / "model.safetensors.part").unlink()
    (target / "model.safetensors").symlink_to(victim)  # at the final name: not taken for the file either
    with HubServer(hub) as server:
        res = fetch(tmp_path, server.url, "--repo", REPO_ID)
    assert res.returncode == 1 and "is a symbolic link" in res.stderr and victim.read_bytes() == b"precious"


def test_a_server_sending_more_than_listed_is_stopped_at_the_listed_size(tmp_path, big_repo):
    hub, data = big_repo
    hub.extra["model.safetensors"] = b"x" * (8 * MIB)
    with HubServer(hub) as server:
        res = fetch(tmp_path, server.url, "--repo", REPO_ID)
    assert res.returncode == 0, res.stderr
    assert (target_of(tmp_path, hub) / "model.safetensors").read_bytes() == data


def test_an_overstated_size_never_wedges_on_416_and_fresh_starts_over(tmp_path, big_repo):
    hub, data = big_repo
    target = target_of(tmp_path, hub)
    target.mkdir(parents=True)
    # a partial file holding all the server has, while the listing claims more: a Range past the end
    (target / "model.safetensors.part").write_bytes(data)
    hub.listed_size["model.safetensors"] = len(data) + MIB
    with HubServer(hub) as server:
        res = fetch(tmp_path, server.url, "--repo", REPO_ID)
        assert res.returncode == 1 and "not the size its listing gives" in res.stderr, res.stderr
        ranges = [r.headers.get("range") for r in hub.gets("model.safetensors")]
        assert ranges == [f"bytes={len(data)}-", None]  # the 416, then once from the start
        assert (target / "model.safetensors.part").stat().st_size == 0  # nothing left to ask a Range for
        hub.listed_size.clear()  # the listing is right again: the next run completes
        (target / "model.safetensors.part").write_bytes(b"\0" * MIB)  # and --fresh drops any partial file
        res = fetch(tmp_path, server.url, "--repo", REPO_ID, "--fresh")
        assert res.returncode == 0, res.stderr
        assert hub.gets("model.safetensors")[-1].headers.get("range") is None
    assert (target / "model.safetensors").read_bytes() == data


def test_a_resumed_run_whose_branch_moved_does_not_reuse_the_old_conversion(tmp_path):
    old = Repo(files={"config.json": b'{"model_type": "llama"}', "model.safetensors": b"old" * 600})
    hub = FakeHub(repos={REPO_ID: old})
    with HubServer(hub) as server:
        assert fetch(tmp_path, server.url, "--repo", REPO_ID).returncode == 1  # no verifier: not converted
    # an earlier try of this run converted the branch's previous commit
    ckpt = tmp_path / "runs" / "fetch" / "checkpoint"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps({"speculators_config": {}}))
    (ckpt / "fetched_from.json").write_text(json.dumps({"repo": REPO_ID, "commit": "0" * 40}))
    with HubServer(hub) as server:
        res = fetch(tmp_path, server.url, "--repo", REPO_ID)
    # the checkpoint there was converted from another commit: this one needs converting (a verifier)
    assert res.returncode == 1 and "pass --verifier" in res.stderr, res.stderr
    (ckpt / "fetched_from.json").write_text(json.dumps({"repo": REPO_ID, "commit": old.commit}))
    with HubServer(hub) as server:
        res = fetch(tmp_path, server.url, "--repo", REPO_ID)
    assert res.returncode == 0, res.stderr
    assert finish(tmp_path)["summary"]["outputs"]["checkpoint"] == str(ckpt)


def test_the_consoles_token_copy_is_removed_once_read(tmp_path):
    """The token the console hands over lives on the host only until the stage has it: gone after the run,
    whether it succeeded or failed; a token file of the operator's own (no --remove-token-file) stays."""
    secret = "hf_s3cretTokenValue0123456789"
    hub = FakeHub(repos={"community/private": Repo(files={"config.json": SPEC_CONFIG})})
    with HubServer(hub) as server:
        for repo, rc in (("community/private", 0), ("community/missing", 1)):
            token_file = tmp_path / "secrets" / "hf-token"
            token_file.parent.mkdir(exist_ok=True)
            token_file.write_text(secret + "\n")
            res = fetch(tmp_path / "w", server.url, "--repo", repo, "--token-file", str(token_file),
                        "--remove-token-file", run_id=f"r{rc}")
            assert res.returncode == rc, res.stderr
            assert not token_file.exists()
        own = tmp_path / "own-token"
        own.write_text(secret + "\n")
        assert fetch(tmp_path / "w", server.url, "--repo", "community/private", "--token-file", str(own),
                     run_id="own").returncode == 0
        assert own.exists()
    assert all(r.headers.get("authorization") == f"Bearer {secret}" for r in hub.requests)
