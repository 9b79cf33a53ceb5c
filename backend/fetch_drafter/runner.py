"""The fetch-drafter stage: a published EAGLE-3 drafter from the Hub, on the host, ready to verify and bench.

`python -m backend.fetch_drafter --work-dir W --repo OWNER/NAME [--revision REV] [--verifier V]
[--endpoint URL] [--token-file PATH [--remove-token-file]] [--aux-layer-ids 1,2,3] [--run-id ID] [--fresh]`

Lists the repo at the revision (pinned to its commit), downloads the files a drafter needs into
`<work dir>/drafters/<owner>--<name>/<commit>/` (backend/fetch_drafter/download.py: a cut download
continues where it stopped on the next run, every file is checked against the Hub's hash), then, when the
checkpoint is not in speculators format, converts it with `speculators convert --algorithm eagle3` into
`<run dir>/checkpoint/`. The summary's `outputs.checkpoint` is what `python -m backend.verify --checkpoint`
and the drafter server take.

Events (backend/contract/events.py): start; progress with `phase` download (done/total in bytes, rate in bytes/s,
files_done, files_total, file) or convert; finish with the summary. The token comes from --token-file or
the HF_TOKEN environment variable, never from the command line, and is never written anywhere; the
console's copy is removed as soon as it is read (--remove-token-file). Plain http reaches only loopback.

Exit codes (backend/contract/exitcodes.py): 0 ready or stopped (SIGTERM; the partial download is kept), 1 the
download or conversion failed (a partial download is kept for the next run), 2 unusable arguments or run
directory (nothing was written).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

from backend.contract.runs import Manifest
from backend.contract.stages import FETCH_DRAFTER as STAGE
from backend.fetch_drafter import convert as cv
from backend.fetch_drafter import download as dl
from backend.fetch_drafter.names import endpoint_problem, repo_id_problem, revision_problem
from backend.kit.lifecycle import StageRun, refuse

DEFAULT_ENDPOINT = "https://huggingface.co"
TOKEN_ENV = "HF_TOKEN"
_ENDPOINT = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(?::\d{1,5})?(?:/[A-Za-z0-9._~/-]*)?")


@dataclass
class FetchConfig:
    work_dir: str
    run_id: str
    repo: str
    revision: str
    endpoint: str
    verifier: str | None
    token_file: str | None
    remove_token_file: bool
    aux_layer_ids: list[int] | None
    python: str
    fresh: bool


def parse_args(argv: list[str] | None) -> FetchConfig:
    p = argparse.ArgumentParser(prog="python -m backend.fetch_drafter", description=__doc__.split("\n")[0])
    p.add_argument("--work-dir", default=".")
    p.add_argument("--run-id", default="fetch-drafter")
    p.add_argument("--repo", required=True, help="the drafter's Hub repo, owner/name")
    p.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    p.add_argument("--verifier", help="the verifier's directory on this host (needed to convert)")
    p.add_argument("--endpoint", help=f"the Hub's address (default $HF_ENDPOINT, else {DEFAULT_ENDPOINT})")
    p.add_argument("--token-file", help=f"a file holding the Hub token (default: ${TOKEN_ENV} if set)")
    p.add_argument("--remove-token-file", action="store_true",
                   help="delete the token file once read (the console's hand-over copy: it never outlives the run)")
    p.add_argument("--aux-layer-ids", help="comma-separated aux layer ids for the converter, when the "
                                           "drafter's own config does not name them")
    p.add_argument("--fresh", action="store_true", help="archive an existing run directory and start over")
    a = p.parse_args(argv)
    if problem := repo_id_problem(a.repo):
        p.error(f"--repo {a.repo!r}: expected {problem}")
    if problem := revision_problem(a.revision):
        p.error(f"--revision {a.revision!r}: expected {problem}")
    endpoint = (a.endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    if not _ENDPOINT.fullmatch(endpoint):
        p.error(f"endpoint {endpoint!r}: expected an http(s) URL such as {DEFAULT_ENDPOINT}")
    if problem := endpoint_problem(endpoint):
        p.error(f"endpoint {endpoint!r}: expected {problem}")
    ids = None
    if a.aux_layer_ids:
        try:
            ids = [int(x) for x in a.aux_layer_ids.split(",")]
        except ValueError:
            p.error(f"--aux-layer-ids {a.aux_layer_ids!r}: expected comma-separated integers such as 2,30,58")
        if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
            p.error(f"--aux-layer-ids {a.aux_layer_ids!r}: expected distinct layer ids >= 0")
    if a.token_file and not os.path.isfile(a.token_file):
        p.error(f"--token-file {a.token_file}: no such file on this host")
    return FetchConfig(work_dir=a.work_dir, run_id=a.run_id, repo=a.repo, revision=a.revision, endpoint=endpoint,
                       verifier=a.verifier, token_file=a.token_file,
                       remove_token_file=a.remove_token_file, aux_layer_ids=ids, python=sys.executable,
                       fresh=a.fresh)


def read_token(c: FetchConfig) -> str | None:
    """The token, from --token-file (removed at once with --remove-token-file: the console's copy lives on
    the host only until the stage has it, so not even a kill -9 leaves it there) or $HF_TOKEN."""
    if c.token_file:
        try:
            with open(c.token_file, encoding="utf-8") as f:
                return f.read().strip() or None
        finally:
            if c.remove_token_file:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(c.token_file)
    return os.environ.get(TOKEN_ENV) or None


class FetchRun:
    def __init__(self, c: FetchConfig, ctx: StageRun, token: str | None):
        self.c, self.ctx, self.token = c, ctx, token
        self.emit = ctx.emit
        self.summary: dict[str, Any] = {"stage": STAGE, "run_id": c.run_id, "repo": c.repo, "revision": c.revision,
                                        "endpoint": c.endpoint}
        ctx.summarize = self._summarize
        ctx.report = self._report_line

    def _report(self, progress: dl.Progress, final: bool) -> None:
        left = progress.total - progress.done
        rate = progress.rate
        self.emit("progress", phase="download", done=progress.done, total=progress.total,
                  rate=round(rate, 1), files_done=progress.files_done,
                  files_total=len(self.summary.get("files") or ()), file=progress.current,
                  eta_s=round(left / rate, 1) if rate > 0 and left > 0 else None, fsync=final)

    def body(self, ctx: StageRun) -> None:
        ctx.start(total=0, phase="list")
        self._run()

    def _summarize(self, status: str, error: str | None) -> dict[str, Any]:
        self.summary["status"] = status
        if status == "stopped":
            error = "stopped by a signal; run again to resume the download"
        if error:
            self.summary["error"] = error
        return self.summary

    def _report_line(self, summary: dict[str, Any]) -> str | None:
        if summary["status"] != "completed":
            return None
        return f"{self.c.repo}@{summary['commit'][:12]}: {summary['outputs']['checkpoint']}"

    def _run(self) -> None:
        c = self.c
        listing = dl.list_repo(c.repo, c.revision, endpoint=c.endpoint, token=self.token)
        target = dl.download_dir(c.work_dir, c.repo, listing.commit)
        self.summary.update(commit=listing.commit, files=[f.path for f in listing.files],
                            skipped_files=list(listing.skipped), bytes=listing.total_bytes,
                            outputs={"download": target})
        progress = dl.Progress(listing.total_bytes, self._report)
        progress.flush()
        started = time.monotonic()
        how = dl.download(listing, target, endpoint=c.endpoint, token=self.token, progress=progress, fresh=c.fresh)
        self.summary.update(transfer=how, fetched_bytes=progress.fetched,
                            download_s=round(time.monotonic() - started, 2))
        config = cv.read_config(target)
        if cv.is_speculators_format(config):
            self.summary.update(converted=False, format="speculators")
            self.summary["outputs"]["checkpoint"] = target
            return
        self.summary["format"] = "eagle3-original"
        out = self.ctx.file("checkpoint")
        if cv.converted_from(out) == listing.commit:  # converted by an earlier try of this run, same commit
            self.summary.update(converted=True)
            self.summary["outputs"]["checkpoint"] = out
            return
        if not c.verifier:
            raise cv.ConvertError(f"{c.repo} is not in speculators format (no speculators_config in its "
                                  f"config.json) and converting it needs the verifier: pass --verifier")
        if not os.path.isdir(c.verifier):
            raise cv.ConvertError(f"verifier {c.verifier} does not exist on this host")
        ids = cv.original_aux_layer_ids(config) or c.aux_layer_ids
        kwargs: dict[str, Any] = {"eagle_aux_hidden_state_layer_ids": ids} if ids else {}
        self.summary["aux_layer_ids"] = ids
        self.emit("progress", phase="convert", done=progress.done, total=progress.total, fsync=True)
        argv = cv.convert(c.python, target, out, c.verifier, kwargs, log_dir=self.ctx.path)
        cv.record_source(out, {"repo": c.repo, "revision": c.revision, "commit": listing.commit,
                               "converted_with": argv[2:]})
        self.summary.update(converted=True)
        self.summary["outputs"]["checkpoint"] = out


def main(argv: list[str] | None = None) -> int:
    c = parse_args(argv)
    try:
        token = read_token(c)
    except OSError as exc:
        return refuse("fetch_drafter", f"cannot read the token file: {exc.strerror}")
    identity = {"repo": c.repo, "revision": c.revision, "verifier": os.path.realpath(c.verifier) if c.verifier else None,
                "aux_layer_ids": c.aux_layer_ids}
    ctx = StageRun(STAGE, c.run_id, work_dir=c.work_dir, fresh=c.fresh, prog="fetch_drafter",
                   manifest=Manifest(stage=STAGE, run_id=c.run_id, identity=identity, settings={"endpoint": c.endpoint}),
                   failures=(dl.HubError, cv.ConvertError))
    # this stage exists to download: an HF_HUB_OFFLINE=1 inherited from the host's environment (set for
    # vLLM and training, which must never fetch) would only turn the download into a puzzling error.
    # huggingface_hub reads it once, at import, which is here.
    os.environ["HF_HUB_OFFLINE"] = "0"
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # progress goes to the events; a bar per file would fill the journal
    return ctx.run(lambda ctx: FetchRun(c, ctx, token).body(ctx))
