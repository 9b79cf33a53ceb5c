"""The console's copies of secrets on the host: files in the work dir's `secrets/` that a run reads and
that never outlive it.

The console uploads a secret a detached stage needs as a 0600 file in the 0700 `<work dir>/secrets/`
(console/control/launch.py): the vLLM API key as a copy per start, named after the run, so no other start
rewrites or removes it; the Hub token as `hf-token` (fetch-drafter removes it once read). Who removes the
API key's copy: the program that reads it, once read (generate's and a lone bench's --remove-api-key-file);
a program that runs others which read it (the bench pair, the pipeline) at its end, whatever the outcome
(--secret-file); the console, for every secret it uploaded, when the start fails before the program runs
(a preflight refused, the start command failed).
"""
from __future__ import annotations

import os
import posixpath
import secrets
import sys

SECRETS_DIR = "secrets"
API_KEY_PREFIX = "vllm-api-key-"


def secrets_dir(work_dir: str) -> str:
    return posixpath.join(work_dir, SECRETS_DIR)


def api_key_file_name(run_id: str) -> str:
    """The API key's copy for one start of `run_id`: the run id, then a random part, so two starts of the
    same run id (one refused by the run lock while the other runs) never share the file one removes."""
    return f"{API_KEY_PREFIX}{run_id}.{secrets.token_hex(4)}"


def check_secret_file(work_dir: str, path: str) -> str:
    """A file this program may remove: one directly in the work dir's secrets/ (ValueError otherwise), so
    a wrong command line never deletes anything else."""
    if not os.path.isabs(path) or os.path.normpath(os.path.dirname(path)) != \
            os.path.normpath(os.path.join(os.path.abspath(work_dir), SECRETS_DIR)) or \
            os.path.basename(path) in ("", ".", ".."):
        raise ValueError(f"--secret-file {path!r}: expected a file in {secrets_dir(work_dir)}/")
    return path


def remove_secret_file(path: str) -> None:
    """Gone, whoever removed it first; a failure is said (never the content) and does not end the run."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        print(f"could not remove the secret file {path}: {exc.strerror}", file=sys.stderr, flush=True)


def read_secret_file(path: str, what: str, *, remove: bool = False) -> str:
    """The secret in `path`, stripped (ValueError naming `what` when it cannot be read or is empty).
    `remove`: the file is the console's copy for this run; deleted once read, also when unusable."""
    try:
        with open(path, encoding="utf-8") as f:
            value = f.read().strip()
    except OSError as exc:
        raise ValueError(f"{what} {path}: cannot read it ({exc.strerror})") from exc
    finally:
        if remove:
            remove_secret_file(path)
    if not value:
        raise ValueError(f"{what} {path}: the file is empty")
    return value


def removable_api_key_file(argv: list[str] | None) -> str | None:
    """The --api-key-file a command line asks to remove once read (--remove-api-key-file), found even
    when the rest of it is refused, so a program that refuses its arguments still removes the copy."""
    import argparse

    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--api-key-file")
    p.add_argument("--remove-api-key-file", action="store_true")
    try:
        ns, _ = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    except SystemExit:  # a malformed line (the flag without its value): nothing this can name
        return None
    return ns.api_key_file if ns.remove_api_key_file and ns.api_key_file else None
