"""A Hub repo downloaded file by file, resumable across runs, every file checked against the Hub's hash.

huggingface_hub lists the repo (`model_info` pins the revision to a commit, `list_repo_tree` gives each
file's size and hash) and fetches each file with its own `http_get`, which resumes from `resume_size`
with a Range request. `snapshot_download` is not used for the transfer: since huggingface_hub 1.x it
writes each file to a temporary name unique to the process and deletes it on failure, so a download
that was cut (a dropped connection, a killed stage, a rebooted host) starts again from byte 0. Here the
partial file is `<file>.part` next to its final name and the next run continues it.

Files go to `<work dir>/drafters/<owner>--<name>/<commit>/`, shared by every run that fetches the same
commit; a lock file keeps two runs from writing the same partial file.
"""
from __future__ import annotations

import errno
import fcntl
import fnmatch
import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Any, Callable

from backend.fetch_drafter.names import folder_name
from backend.kit.lifecycle import is_full_disk

# what a drafter needs; a repo's pictures, notebooks, code and training state (optimizer files can be
# several times the weights) are left on the Hub
ALLOW = ("*.json", "*.safetensors", "pytorch_model*.bin", "*.md", "*.txt")
PART = ".part"
LOCK = ".fetch.lock"
MAX_FILES = 2000
_COMMIT = re.compile(r"[0-9a-f]{40}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class HubError(Exception):
    """The download cannot go on; the message says why (in one or two lines) and what to do."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None = None  # LFS files: the content's sha256
    blob_id: str | None = None  # other files: the git blob id (sha1 of "blob <size>\0" + content)


@dataclass(frozen=True)
class Listing:
    repo_id: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]
    skipped: tuple[str, ...]  # files in the repo that a drafter does not need

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def safe_repo_path(path: Any) -> str | None:
    """A file path from the Hub's listing, if it may be written under the download directory."""
    if not isinstance(path, str) or not path or len(path) > 512 or _CONTROL.search(path) or "\\" in path:
        return None
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or path.endswith(PART) or parts[-1] == LOCK:
        return None
    return path


def _describe_hub_error(exc: Exception, repo_id: str, revision: str, endpoint: str) -> str:
    from huggingface_hub.utils import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, GatedRepoError):
        return (f"{repo_id} on {endpoint} is gated: accept its terms on the Hub with your account and give "
                f"the stage a token (set [bench].hub_token_upload = true in the profile)")
    if isinstance(exc, RepositoryNotFoundError):
        return (f"no model repo {repo_id!r} on {endpoint} (a typo in [bench].third_drafter, or a private repo "
                f"that needs a token: [bench].hub_token_upload = true)")
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo_id} has no revision {revision!r} on {endpoint} ([bench].third_revision)"
    if isinstance(exc, HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        return f"{endpoint} answered HTTP {status} for {repo_id}; try again later"
    return f"cannot reach {endpoint} for {repo_id} ({type(exc).__name__}: {str(exc)[:300]})"


def list_repo(repo_id: str, revision: str, *, endpoint: str, token: str | None) -> Listing:
    """The files at `revision`, pinned to its commit."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token or False, library_name="eagle3-console")
    try:
        info = api.model_info(repo_id, revision=revision)
        commit = info.sha
        if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
            raise HubError(f"{endpoint} gave no commit for {repo_id} at {revision!r} (got {str(commit)[:60]!r})")
        entries = []
        for entry in api.list_repo_tree(repo_id, revision=commit, recursive=True):
            if isinstance(entry, RepoFile):
                entries.append(entry)
                if len(entries) > MAX_FILES:
                    raise HubError(f"{repo_id} holds more than {MAX_FILES} files: not a drafter checkpoint")
    except HubError:
        raise
    except Exception as exc:  # huggingface_hub's errors and the transport's: one line for the operator
        raise HubError(_describe_hub_error(exc, repo_id, revision, endpoint)) from None
    files, skipped = [], []
    for entry in entries:
        path = safe_repo_path(entry.path)
        if path is None:
            raise HubError(f"{repo_id} lists a file named {str(entry.path)[:80]!r}, which cannot be written safely")
        if not any(fnmatch.fnmatch(path.rsplit("/", 1)[-1], pat) for pat in ALLOW):
            skipped.append(path)
            continue
        size = entry.lfs.size if entry.lfs is not None else entry.size
        if not isinstance(size, int) or size < 0:
            raise HubError(f"{repo_id}: the listing gives {path} no size")
        files.append(RemoteFile(path=path, size=size, sha256=entry.lfs.sha256 if entry.lfs is not None else None,
                                blob_id=None if entry.lfs is not None else entry.blob_id))
    if not any(f.path == "config.json" for f in files):
        raise HubError(f"{repo_id} at {revision} has no config.json at its top level: not a model checkpoint "
                       f"(files: {', '.join(sorted(f.path for f in files)[:6]) or 'none'})")
    return Listing(repo_id=repo_id, revision=revision, commit=commit, files=tuple(sorted(files, key=lambda f: f.path)),
                   skipped=tuple(sorted(skipped)))


def download_dir(work_dir: str, repo_id: str, commit: str) -> str:
    return os.path.join(os.path.abspath(work_dir), "drafters", folder_name(repo_id), commit)


class Progress:
    """Bytes on disk for the whole listing; `report` is called at most every `interval` seconds."""

    def __init__(self, total: int, report: Callable[["Progress", bool], None], interval: float = 1.0):
        self.total, self.report, self.interval = total, report, interval
        self.done = 0
        self.fetched = 0  # bytes this run received (the rest was on disk already)
        self.started = time.monotonic()
        self.files_done = 0
        self.current = ""
        self._last = 0.0

    def add(self, n: int, *, fetched: bool = True) -> None:
        self.done += n
        if fetched:
            self.fetched += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self.report(self, False)

    def flush(self) -> None:
        self._last = time.monotonic()
        self.report(self, True)

    @property
    def rate(self) -> float:
        return self.fetched / max(1e-9, time.monotonic() - self.started)


class _TooLong(Exception):
    """The server sent more bytes than the listing gives the file."""


class _Counting:
    """The partial file as http_get writes it: every write counted into the progress, and nothing written
    past the listed size (a server sending more would fill the disk past the free-space check)."""

    def __init__(self, f, progress: Progress, size: int):
        self._f, self._progress, self._size = f, progress, size

    def write(self, data: bytes) -> int:
        room = self._size - self._f.tell()
        if len(data) > room:
            if room > 0:
                self._f.write(data[:room])
                self._progress.add(room)
            raise _TooLong()
        n = self._f.write(data)
        self._progress.add(len(data))
        return n

    def __getattr__(self, name: str) -> Any:  # tell, seek, truncate, flush: the file's own
        return getattr(self._f, name)


def file_digest(path: str, f: RemoteFile) -> tuple[str, str] | None:
    """(kind, expected) when the file's content does not match the Hub's hash; None when it does."""
    if f.sha256:
        h, want, kind = hashlib.sha256(), f.sha256, "sha256"
    elif f.blob_id:
        h, want, kind = hashlib.sha1(), f.blob_id, "git blob id"
        h.update(f"blob {f.size}\0".encode())
    else:
        return None
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return None if h.hexdigest() == want else (kind, want)


def _status(exc: BaseException) -> int | None:
    return getattr(getattr(exc, "response", None), "status_code", None)


def _no_links(target_dir: str, rel: str) -> None:
    """Refuse a symbolic link anywhere from the download folder down to the file: the folder is shared by
    every run of the commit, and a link planted there would have a download written, or a file taken,
    somewhere else."""
    path = target_dir
    for part in ["", *rel.split("/")]:
        path = os.path.join(path, part) if part else path
        if os.path.islink(path):
            raise HubError(f"{path} is a symbolic link: a download folder holds plain files only; remove it "
                           f"and run again")


def _open_part(part: str) -> int:
    """The partial file, opened without following a link (O_NOFOLLOW: a link planted between the check and
    the open fails the open instead of being written through)."""
    try:
        return os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HubError(f"{part} is a symbolic link: a download folder holds plain files only; remove it "
                           f"and run again") from None
        raise


def fetch_file(listing: Listing, f: RemoteFile, target_dir: str, *, endpoint: str, token: str | None,
               progress: Progress) -> str:
    """Download one file (continuing its partial file); returns 'present', 'resumed' or 'fetched'.

    What is kept is verified: a file already at its final name is hashed too (the folder is shared and a
    run can be killed mid-rename), and is downloaded again when it does not match."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    _no_links(target_dir, f.path)
    dest = os.path.join(target_dir, *f.path.split("/"))
    progress.current = f.path
    if os.path.isfile(dest) and os.path.getsize(dest) == f.size:
        if file_digest(dest, f) is None:
            progress.add(f.size, fetched=False)
            return "present"
        os.unlink(dest)  # not the listed content (a foreign writer, a torn copy): fetch it again
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    _no_links(target_dir, f.path)
    part = dest + PART
    url = hf_hub_url(listing.repo_id, f.path, revision=listing.commit, endpoint=endpoint)
    headers = build_hf_headers(token=token or False, library_name="eagle3-console")
    fd = _open_part(part)
    with os.fdopen(fd, "r+b") as fh:
        have = os.fstat(fd).st_size
        if have > f.size:  # not a prefix of this file (another commit's?): start it over
            fh.truncate(0)
            have = 0
        resumed = have
        progress.add(have, fetched=False)
        for attempt in (1, 2):
            try:
                fh.seek(have)
                http_get(url, _Counting(fh, progress, f.size), resume_size=have, headers=headers,
                         expected_size=f.size)
            except _TooLong:
                break  # the listed size is on disk; the hash below says whether it is the file
            except Exception as exc:
                if is_full_disk(exc):  # the lifecycle's finish names the full volume: the partial file's
                    raise OSError(exc.errno, exc.strerror, part) from None
                if _status(exc) == 416 and have and attempt == 1:
                    # the server has no bytes past what is here: the listing overstated the size, or the
                    # partial file is not this file's. Start over once rather than ask the same for ever.
                    progress.add(-have, fetched=False)
                    fh.truncate(0)
                    have = resumed = 0
                    continue
                fh.flush()
                kept = os.fstat(fd).st_size
                short = "Consistency check failed" in str(exc)
                if short or _status(exc) == 416:
                    fh.truncate(0)  # the file the server has is not the listed one: nothing to resume
                raise HubError(
                    f"downloading {listing.repo_id}/{f.path} failed after {kept} of {f.size} bytes "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                    + ("the Hub's file is not the size its listing gives: run again later" if short or
                       _status(exc) == 416 else "the partial file is kept: run again to resume")) from None
            break
        fh.flush()
        os.fsync(fh.fileno())
    bad = file_digest(part, f)
    if bad is not None:
        os.unlink(part)
        raise HubError(f"{listing.repo_id}/{f.path}: the downloaded bytes do not match the Hub's {bad[0]} "
                       f"{bad[1][:16]}...; the file was removed: run again to download it afresh")
    os.replace(part, dest)
    return "resumed" if resumed else "fetched"


def drop_partial_files(target_dir: str) -> int:
    """`--fresh`: the partial files of this commit's folder go too (a bad one would be resumed again)."""
    dropped = 0
    for root, _dirs, names in os.walk(target_dir):
        for name in names:
            if name.endswith(PART):
                os.unlink(os.path.join(root, name))
                dropped += 1
    return dropped


def check_space(listing: Listing, target_dir: str) -> None:
    """Refuse up front when what is still missing does not fit on the disk (never fill it halfway)."""
    missing = 0
    for f in listing.files:
        dest = os.path.join(target_dir, *f.path.split("/"))
        if os.path.isfile(dest) and os.path.getsize(dest) == f.size:
            continue
        part = dest + PART
        missing += f.size - (os.path.getsize(part) if os.path.isfile(part) else 0)
    free = shutil.disk_usage(target_dir).free
    if missing > free:
        raise HubError(f"{listing.repo_id} needs {missing / 2**30:.2f} GiB more in {target_dir} but only "
                       f"{free / 2**30:.2f} GiB are free: make room and run again")


class RepoLock:
    """One fetch per download directory at a time (they would write the same partial files)."""

    def __init__(self, target_dir: str):
        os.makedirs(target_dir, exist_ok=True)
        self.path = os.path.join(target_dir, LOCK)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise HubError(f"another fetch is downloading into {target_dir}: wait for it (or stop it)") from None

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


def download(listing: Listing, target_dir: str, *, endpoint: str, token: str | None,
             progress: Progress, fresh: bool = False) -> dict[str, str]:
    """Every file of the listing under `target_dir`; returns how each one came to be there. `fresh`: the
    partial files there are dropped first."""
    how: dict[str, str] = {}
    drafters = os.path.dirname(os.path.dirname(target_dir))
    for path in (drafters, os.path.dirname(target_dir), target_dir):
        if os.path.islink(path):
            raise HubError(f"{path} is a symbolic link: the download folder must be a plain folder of the work "
                           f"dir; remove the link and run again")
    lock = RepoLock(target_dir)
    try:
        if fresh:
            drop_partial_files(target_dir)
        check_space(listing, target_dir)
        for f in listing.files:
            how[f.path] = fetch_file(listing, f, target_dir, endpoint=endpoint, token=token, progress=progress)
            progress.files_done += 1
            progress.flush()
    finally:
        lock.release()
    return how
