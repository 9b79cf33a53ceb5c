"""The console's side of fetching a published drafter: its command line from the profile, the Hub token as a
private file, and `eagle3-console run fetch-drafter --wait` on the demo host (tmux) against a Hub stand-in,
with the run's progress in the stages pane."""
from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from backend.fetch_drafter.runner import parse_args
from console import demo
from console.control.launch import upload_hub_token
from console.control.stage_argv import StageArgError, fetch_drafter_argv
from console.host.local import LocalHost
from console.profile import load_profile, profile_from_dict, write_profile
from console.session import Session
from harness.fake_hub import FakeHub, HubServer, Repo

REPO = Path(__file__).resolve().parent.parent
BASE = {"host": {"name": "gpu-host.example"}, "server": {"model_path": "/models/kimi", "unit": "vllm-kimi"},
        "paths": {"work_dir": "/data/eagle3", "python": "/opt/py/bin/python3"}}


def test_the_stage_parses_exactly_what_the_console_sends(tmp_path):
    p = profile_from_dict({**BASE, "bench": {"third_drafter": "lightseekorg/kimi-k2.5-eagle3", "third_revision": "v2",
                                             "hub_endpoint": "https://hub-mirror.example"}})
    token = tmp_path / "hf-token"  # uploaded by the console; the stage checks it exists
    token.write_text("hf_x\n")
    argv = fetch_drafter_argv(p, "fd1", token_path=str(token))
    assert argv[:3] == ["/opt/py/bin/python3", "-m", "backend.fetch_drafter"]
    c = parse_args(argv[3:])
    assert (c.work_dir, c.run_id, c.repo, c.revision, c.verifier, c.endpoint, c.token_file) == \
        ("/data/eagle3", "fd1", "lightseekorg/kimi-k2.5-eagle3", "v2", "/models/kimi", "https://hub-mirror.example",
         str(token))
    assert "--fresh" in fetch_drafter_argv(p, "fd1", fresh=True)
    with pytest.raises(StageArgError, match=r"set \[bench\].third_drafter"):
        fetch_drafter_argv(profile_from_dict(BASE), "fd1")


def test_hub_token_reaches_the_host_as_a_private_file(tmp_path, monkeypatch):
    p = profile_from_dict({**BASE, "host": {"name": "localhost", "transport": "local"},
                           "paths": {"work_dir": str(tmp_path)},
                           "bench": {"hub_token_env": "E3_TEST_HF_TOKEN", "hub_token_upload": True}})
    monkeypatch.delenv("E3_TEST_HF_TOKEN", raising=False)
    assert asyncio.run(upload_hub_token(LocalHost(), p)) is None and not (tmp_path / "secrets").exists()
    monkeypatch.setenv("E3_TEST_HF_TOKEN", "hf_very_secret")
    path = asyncio.run(upload_hub_token(LocalHost(), p))
    assert path and open(path).read().strip() == "hf_very_secret"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    argv = fetch_drafter_argv(profile_from_dict({**BASE, "bench": {"third_drafter": "o/n"}}), "r", token_path=path)
    assert "hf_very_secret" not in " ".join(argv) and argv[argv.index("--token-file") + 1] == path
    assert "--remove-token-file" in argv  # the stage deletes the console's copy once read


def test_the_token_goes_to_the_host_only_when_the_profile_says_the_repo_needs_it(tmp_path, monkeypatch):
    """The default HF_TOKEN is the operator's personal token: a public repo never gets it on the host."""
    p = profile_from_dict({**BASE, "host": {"name": "localhost", "transport": "local"},
                           "paths": {"work_dir": str(tmp_path)}})
    monkeypatch.setenv("HF_TOKEN", "hf_personal")
    assert p.bench.hub_token_env == "HF_TOKEN" and p.bench.hub_token_upload is False
    assert asyncio.run(upload_hub_token(LocalHost(), p)) is None and not (tmp_path / "secrets").exists()


def test_a_token_file_others_can_read_is_warned_about(tmp_path, monkeypatch):
    token = tmp_path / "hf-token-file"
    token.write_text("hf_from_file\n")
    token.chmod(0o644)
    p = profile_from_dict({**BASE, "host": {"name": "localhost", "transport": "local"},
                           "paths": {"work_dir": str(tmp_path / "w")},
                           "bench": {"hub_token_env": "E3_TEST_HF_TOKEN", "hub_token_file": str(token),
                                     "hub_token_upload": True}})
    monkeypatch.delenv("E3_TEST_HF_TOKEN", raising=False)
    shown: list[str] = []
    path = asyncio.run(upload_hub_token(LocalHost(), p, shown))
    assert open(path).read().strip() == "hf_from_file"
    assert shown == [f"(warning) {token} can be read by others (mode 644): `chmod 600 {token}`; it holds your "
                     f"Hub token"]
    token.chmod(0o600)
    shown.clear()
    asyncio.run(upload_hub_token(LocalHost(), p, shown))
    assert shown == []


@pytest.mark.parametrize("endpoint, ok", [
    ("https://huggingface.co", True), ("https://hub-mirror.example/hf", True), ("http://127.0.0.1:8080", True),
    ("http://localhost:9", True), ("http://hub-mirror.example", False),
    ("http://192.0.2.1", False),
])
def test_plain_http_reaches_only_loopback(endpoint, ok, tmp_path):
    from console.profile import ProfileError
    data = {**BASE, "bench": {"third_drafter": "o/n", "hub_endpoint": endpoint}}
    if ok:
        profile_from_dict(data)
    else:
        with pytest.raises(ProfileError, match="bench.hub_endpoint"):
            profile_from_dict(data)
    args = ["--work-dir", str(tmp_path), "--repo", "o/n", "--endpoint", endpoint]
    if ok:
        assert parse_args(args).endpoint == endpoint.rstrip("/")
    else:
        res = subprocess.run([sys.executable, "-m", "backend.fetch_drafter", *args], capture_output=True, text=True,
                             cwd=REPO, timeout=60)
        assert res.returncode == 2 and "plain http only to a loopback" in res.stderr, res.stderr


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    return subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL, env=env)


@pytest.mark.timeout(240)
async def test_run_fetch_drafter_wait_on_the_demo_host(tmp_path):
    from console.ui.panes.stages import stage_rows

    weights = os.urandom(3 * 2**20)
    config = json.dumps({"speculators_model_type": "eagle3", "speculators_config": {"algorithm": "eagle3"}}).encode()
    hub = FakeHub(repos={"community/kimi-eagle3": Repo(files={"config.json": config, "model.safetensors": weights})})
    work = tmp_path / "d"
    profile = demo.prepare(work, speed=10)
    with HubServer(hub) as server:
        profile.bench.third_drafter = "community/kimi-eagle3"
        profile.bench.hub_endpoint = server.url
        write_profile(profile, profile.source, overwrite=True)
        try:
            res = await asyncio.to_thread(cli, "run", "fetch-drafter", "--profile", profile.source, "--run-id", "fd",
                                          "--wait", "--interval", "0.3")
            assert res.returncode == 0, res.stderr
            assert "done: 3.0/3.0 MiB" in res.stdout
            commit = hub.repos["community/kimi-eagle3"].commit
            target = work / "drafters" / "community--kimi-eagle3" / commit
            assert f"checkpoint: {target}" in res.stdout
            assert (target / "model.safetensors").read_bytes() == weights
            async with Session(load_profile(profile.source), interval=0.2) as session:
                snap = await session.settle()
                row = next(r for r in stage_rows(snap) if r.stage == "fetch_drafter")
                assert (row.state, row.detail, row.unit) == ("done", "100%", "e3-fetch_drafter-fd")
        finally:
            cli("demo-host", "stop", "--dir", str(work))


def test_verify_takes_a_fetched_checkpoint_with_the_profiles_verifier():
    from backend.verify.runner import parse_args as verify_args
    from console.control.stage_argv import verify_argv

    p = profile_from_dict({**BASE, "drafter": {"num_speculative_tokens": 4}})
    argv = verify_argv(p, "v-third", "train-1", checkpoint="/data/eagle3/runs/fd/checkpoint")
    c = verify_args(argv[3:])
    assert (c.checkpoint, c.verifier, c.input_run, c.speculative_tokens) == \
        ("/data/eagle3/runs/fd/checkpoint", "/models/kimi", "train-1", 4)
    assert "--checkpoint" not in verify_argv(p, "v", None)


def test_run_checkpoint_is_refused_for_other_stages_and_bad_paths(tmp_path):
    from console.control.launch import StageError, check_host_path

    res = cli("run", "train", "--profile", str(REPO / "profiles" / "kimi-k25-int4.toml"), "--checkpoint", "/x")
    assert res.returncode == 2 and "--checkpoint is for verify" in res.stderr
    for bad in ("relative/ckpt", "/x\n", "/a b", "/a/../b"):
        with pytest.raises(StageError, match="--checkpoint"):
            check_host_path(bad, "--checkpoint")
