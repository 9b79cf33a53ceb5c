"""Profile schema: round trip, every validation path, shell-injection attempts."""
from __future__ import annotations

import tomllib
import json
from pathlib import Path

import pytest
import tomli_w

from console.profile import ProfileError, load_profile, profile_from_dict, write_profile
from console.cli import main

ROOT = Path(__file__).resolve().parents[1]
BASE = {
    "host": {"name": "gpu-host.example", "user": "ubuntu"},
    "server": {"model_path": "/shared/kimi-k2.5-int4", "unit": "vllm-kimi"},
    "paths": {"work_dir": "/data/eagle3"},
}


def with_value(section: str, key: str, value) -> dict:
    data = {k: dict(v) for k, v in BASE.items()}
    data.setdefault(section, {})[key] = value
    return data


def problems(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(ProfileError) as exc:
        profile_from_dict(data, file="p.toml")
    return exc.value.problems


def test_shipped_profiles_load():
    for path in (ROOT / "profiles").glob("*.toml"):
        load_profile(path)
    p = load_profile(ROOT / "profiles/kimi-k25-int4.toml")
    assert p.host.name == "gpu-host.example"
    assert p.server.unit == "vllm-kimi-k25-int4" and p.server.manager == "systemd"
    assert p.server.model_path == "/shared/kimi-k2.5-int4"
    assert p.paths.data_dir == "/data" and p.gpus.count == 8
    assert (p.generate.samples, p.generate.concurrency, p.generate.max_tokens) == (10000, 200, 8192)
    assert p.generate.request_timeout_s == 1800


def test_init_then_load_round_trip(tmp_path):
    out = tmp_path / "new.toml"
    rc = main(["profile", "init", str(out), "--host", "gpu-host.example", "--user", "ops", "--port", "2222",
               "--unit", "vllm-x", "--model-path", "/models/x", "--work-dir", "/srv/e3", "--gpus", "4",
               "--manager", "tmux", "--jump-host", "ops@bastion.example:22"])
    assert rc == 0
    p = load_profile(out)
    assert (p.host.port, p.host.user, p.host.jump_host) == (2222, "ops", "ops@bastion.example:22")
    assert (p.server.manager, p.server.unit, p.gpus.count) == ("tmux", "vllm-x", 4)
    # written by tomli-w, loads back to the same data
    assert tomllib.loads(p.to_toml()) == tomllib.loads(out.read_text())


def test_init_says_sudo_for_a_user_other_than_root_with_systemd(tmp_path):
    """systemd-run and systemctl start/stop need polkit's manage-units, which a non-root SSH user cannot
    answer: through `sudo -n` (console/control/permissions.py checks it works)."""
    for user, sudo in (("ubuntu", True), ("root", False)):
        out = tmp_path / f"{user}.toml"
        assert main(["profile", "init", str(out), "--host", "h.example", "--user", user, "--model-path", "/m",
                     "--work-dir", "/w"]) == 0
        assert load_profile(out).server.sudo is sudo
    tmux = tmp_path / "tmux.toml"
    assert main(["profile", "init", str(tmux), "--host", "h.example", "--user", "ubuntu", "--manager", "tmux",
                 "--model-path", "/m", "--work-dir", "/w"]) == 0
    assert load_profile(tmux).server.sudo is False  # tmux sessions are the user's own


def test_init_never_overwrites(tmp_path, capsys):
    out = tmp_path / "p.toml"
    out.write_text("# my edits\n")
    rc = main(["profile", "init", str(out), "--host", "h.example", "--model-path", "/m", "--work-dir", "/w"])
    assert rc == 2 and out.read_text() == "# my edits\n"
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize("section,key,value,expect", [
    ("host", "port", 70000, "expected a number from 1 to 65535"),
    ("host", "port", "22", "expected an integer"),
    ("host", "port", True, "expected an integer"),
    ("host", "transport", "telnet", "expected one of 'ssh', 'local'"),
    ("host", "colour", "red", "unknown key"),
    ("generate", "concurrency", 0, "expected a number from 1"),
    ("generate", "temperature", "hot", "expected a number"),
    ("generate", "chat_template_kwargs", 3, "expected a table"),
    ("gpus", "command", [], "non-empty list"),
    ("gpus", "command", ["nvidia-smi", 3], "expected a list of strings"),
    ("server", "api_key", "sk-123", "secrets never go in a profile"),
    ("server", "manager", "docker", "expected one of 'systemd', 'tmux'"),
])
def test_validation_errors_name_key_and_expectation(section, key, value, expect):
    found = problems(with_value(section, key, value))
    assert any(k == f"{section}.{key}" and expect in msg for k, msg in found), found


@pytest.mark.parametrize("section,key,value", [
    ("server", "unit", "vllm; rm -rf /"),
    ("server", "unit", "vllm$(reboot)"),
    ("server", "unit", "-vllm"),
    ("server", "unit", "a b"),
    ("paths", "work_dir", "/data/`id`"),
    ("paths", "work_dir", "/data/../etc"),
    ("paths", "work_dir", "relative/dir"),
    ("paths", "work_dir", "/data/x y"),
    ("paths", "python", "python3;id"),
    ("host", "name", "gpu-host.example;id"),
    ("host", "name", "-oProxyCommand=id"),
    ("host", "user", "root$(id)"),
    ("host", "jump_host", "a@b:c;d"),
    ("host", "identity_file", "~/.ssh/id|x"),
    ("server", "model_path", "/m\nExecStart=/bin/sh"),
    ("server", "served_model_name", "x' OR '1"),
    ("server", "vllm_args", ["--x", "a\nb"]),
    ("server", "api_key_env", "VLLM-KEY"),
])
def test_shell_injection_attempts_rejected(section, key, value):
    found = problems(with_value(section, key, value))
    assert any(k == f"{section}.{key}" for k, _ in found), found


def test_tmux_session_name_checked_for_tmux_manager():
    data = with_value("server", "manager", "tmux")
    data["server"]["unit"] = "vllm.service"
    assert problems(data)[0][0] == "server.unit"


def test_missing_tables_and_keys_all_reported():
    found = problems({"host": {}, "bogus": {}})
    keys = {k for k, _ in found}
    assert {"bogus", "[server]", "[paths]", "host.name"} <= keys


def test_toml_syntax_error_has_line_and_column(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[host]\nname = "x"\nport = = 3\n')
    with pytest.raises(ProfileError) as exc:
        load_profile(bad)
    msg = str(exc.value)
    assert str(bad) in msg and "line 3" in msg and "column" in msg


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(ProfileError, match="file not found"):
        load_profile(tmp_path / "none.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ProfileError, match="not UTF-8"):
        load_profile(binary)


def test_check_command(tmp_path, capsys):
    assert main(["profile", "check", str(ROOT / "profiles/kimi-k25-int4.toml")]) == 0
    bad = tmp_path / "broken.toml"
    bad.write_text(tomli_w.dumps(with_value("server", "port", 0)))
    assert main(["profile", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: server.port: expected a number from 1 to 65535, got 0" in err


def test_write_profile_is_atomic_and_validated(tmp_path):
    p = profile_from_dict(BASE, file="x")
    target = tmp_path / "sub" / "p.toml"
    write_profile(p, target)
    assert load_profile(target).host.name == "gpu-host.example"
    assert not list(target.parent.glob(".*.tmp"))


def test_third_drafter_is_a_hub_repo_id_checked_whole():
    p = profile_from_dict(with_value("bench", "third_drafter", "lightseekorg/kimi-k2.5-eagle3"))
    assert (p.bench.third_drafter, p.bench.third_revision, p.bench.hub_token_env) == \
        ("lightseekorg/kimi-k2.5-eagle3", "main", "HF_TOKEN")
    # the example names one in a comment (run bench refuses while a named one is not fetched and verified)
    example = (ROOT / "profiles/kimi-k25-int4.toml").read_text()
    assert load_profile(ROOT / "profiles/kimi-k25-int4.toml").bench.third_drafter is None
    uncommented = example.replace("# third_drafter = ", "third_drafter = ").replace("# third_revision", "third_revision")
    assert profile_from_dict(tomllib.loads(uncommented)).bench.third_drafter == "owner/kimi-k2.5-eagle3"
    for bad in ("kimi-eagle3", "org/name\n", "org/../x", "org/name; rm -rf /", "-org/x", "org/x/y", "org/a--b",
                "org/ümlaut", "org/x.git"):
        ((key, msg),) = problems(with_value("bench", "third_drafter", bad))
        assert key == "bench.third_drafter" and "owner/name" in msg
    for bad in ("main\n", "../x", "v1 2", "-x"):
        ((key, msg),) = problems(with_value("bench", "third_revision", bad))
        assert key == "bench.third_revision" and "branch, tag or commit" in msg
    ((key, msg),) = problems(with_value("bench", "hub_endpoint", "ftp://hub.example"))
    assert key == "bench.hub_endpoint" and "http(s) URL" in msg
    # a token never goes in a profile
    ((key, msg),) = problems(with_value("bench", "hub_token", "hf_x"))
    assert key == "bench.hub_token" and "secrets never go in a profile" in msg


def float_keys() -> list[tuple[str, str]]:
    """Every key of the profile that takes a float (TOML's nan and inf are floats)."""
    import dataclasses
    import typing
    from console.profile import Profile
    out = []
    for section in dataclasses.fields(Profile):
        cls = typing.get_type_hints(Profile)[section.name]
        if not dataclasses.is_dataclass(cls):
            continue
        for f in dataclasses.fields(cls):
            if float in (typing.get_type_hints(cls)[f.name], *typing.get_args(typing.get_type_hints(cls)[f.name])):
                out.append((section.name, f.name))
    return out


def test_every_float_key_refuses_nan_and_infinities():
    keys = float_keys()
    assert len(keys) >= 13 and ("train", "learning_rate") in keys and ("extract", "reserve_gib") in keys
    for section, key in keys:
        for value in (float("nan"), float("inf"), float("-inf")):
            found = problems(with_value(section, key, value))
            assert any(k == f"{section}.{key}" and "expected a finite number" in msg for k, msg in found), \
                (section, key, value, found)


def test_nan_in_a_profile_file_names_the_key(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[host]\nname = "gpu-host.example"\n[server]\nmodel_path = "/m"\nstop_timeout_s = nan\n'
                    '[paths]\nwork_dir = "/w"\n[train]\nlearning_rate = inf\n')
    with pytest.raises(ProfileError) as exc:
        load_profile(path)
    assert "server.stop_timeout_s: expected a finite number, got nan" in str(exc.value)
    assert "train.learning_rate: expected a finite number, got inf" in str(exc.value)


@pytest.mark.parametrize("key, value", [
    ("connector", "Example Connector"), ("connector", "os.system"), ("connector", "X;id"), ("connector", ""),
    ("connector_module", "sim..connector"), ("connector_module", "sim/connector"), ("connector_module", ".sim"),
    ("connector_module", "sim.connector\nx"), ("connector_module", "1sim"),
])
def test_extraction_connector_values_are_whole_identifiers(key, value, tmp_path):
    """[extract] connector / connector_module reach vLLM's importlib: only a class name and a dotted
    module path, refused with the file and the key otherwise."""
    found = problems(with_value("extract", key, value))
    assert [k for k, _ in found] == [f"extract.{key}"], found
    path = tmp_path / "p.toml"
    path.write_text('[host]\nname = "gpu-host.example"\n[server]\nmodel_path = "/m"\n[paths]\nwork_dir = "/w"\n'
                    f'[extract]\n{key} = {json.dumps(value)}\n')
    with pytest.raises(ProfileError) as exc:
        load_profile(path)
    assert str(path) in str(exc.value) and f"extract.{key}" in str(exc.value)


def test_extraction_connector_defaults_to_vllms_own():
    p = profile_from_dict(BASE, file="p.toml")
    assert (p.extract.connector, p.extract.connector_module) == ("ExampleHiddenStatesConnector", None)
    ok = profile_from_dict(with_value("extract", "connector_module", "sim.cpu_hidden_states_connector"), file="p.toml")
    assert ok.extract.connector_module == "sim.cpu_hidden_states_connector"
