"""What the installed console reads at run time comes from its packages, never from the source tree.

The slow proof (a built wheel in a fresh venv) is tests/test_packaging.py; these are the quick checks
of the same facts from the checkout: the version comes from the package metadata, the demo template
is package data, and the backend upload holds host code only.
"""
from __future__ import annotations

import ast
import hashlib
import io
import tarfile
from importlib.metadata import version
from importlib.resources import files
from pathlib import Path

import pytest

from console.cli import main
from console.control.launch import backend_bundle
from console.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
# Top-level packages of this project that must never reach a GPU host.
NOT_HOST_CODE = {"console", "sim", "tests"}


def test_version_comes_from_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"eagle3-console {version('eagle3-console')}"


def test_help_screen_shows_the_version():
    from console.ui.keys import visible_keys
    from console.ui.screens.help import help_markup
    text = help_markup(visible_keys(False), {}, readonly=False).plain
    assert text.splitlines()[0] == f"eagle3-console {version('eagle3-console')}"


def test_demo_template_is_package_data_and_the_only_copy():
    template = files("console") / "demo.toml"
    assert template.is_file()
    assert not (ROOT / "profiles" / "demo.toml").exists()  # one definition: operators' examples only there
    p = load_profile(Path(str(template)))
    assert p.host.simulated and p.host.transport == "local"


def _members(bundle: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_backend_bundle_holds_host_code_only():
    version_hash, bundle = backend_bundle()
    members = _members(bundle)
    installed = files("backend")
    on_disk = {"backend/" + p.relative_to(Path(str(installed))).as_posix()
               for p in Path(str(installed)).rglob("*.py") if "__pycache__" not in p.parts}
    assert set(members) == on_disk and "backend/generate/__main__.py" in members
    for name, data in members.items():
        for node in ast.walk(ast.parse(data, name)):
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = {node.module.split(".")[0]}
            else:
                continue
            assert not tops & NOT_HOST_CODE, f"{name}:{node.lineno} imports {tops & NOT_HOST_CODE}: not host code"
    # the content hash covers exactly what is uploaded, in order: nothing of sim/ or console/ moves it
    digest = hashlib.sha256()
    for name in sorted(members, key=lambda n: tuple(n.split("/"))):
        digest.update(name.encode() + b"\0" + members[name] + b"\0")
    assert digest.hexdigest()[:16] == version_hash
    assert backend_bundle() == (version_hash, bundle)  # byte for byte: the same code, the same upload
