"""The oldest vLLM an extraction server can run on, for a given verifier, and the check of the baseline's
version against it before the baseline is stopped for the swap.

- 0.17.0 for every verifier: the first release with the `extract_hidden_states` speculative method and the
  `ExampleHiddenStatesConnector` KV connector the extraction server is started with (the `serve` extra's
  floor in pyproject.toml).
- 0.25.0 for the DeepSeek-V2 family (deepseek_v2, deepseek_v3, kimi_k2; Kimi-K2.5 wraps a kimi_k2 /
  deepseek_v3 text model): the extraction server is asked for the final layer's state as well
  (backend/kit/verifier.extraction_layer_ids), and vLLM's DeepSeek-V2 model returns that state only from
  0.25.0: 0.24.0's `DeepseekV2Model.forward` captures layer inputs only (deepseek_v2.py:1334-1352), 0.25.0
  adds `if self.end_layer in self.aux_hidden_state_layers` after the loop (deepseek_v2.py:1489-1490). An
  older server loads (22 minutes for Kimi-K2.5 INT4 on TP8) and then fails the first request: its
  extract_hidden_states proposer copies one state fewer than its buffer holds (0.24.0
  v1/spec_decode/extract_hidden_states.py:125-129). Checked in both sdists: /work/shared/notes/vllm-surface.md.

The version is the baseline's own `GET /version` (the same vLLM install the extraction server starts from:
both run the operator unit's program). Its answer is untrusted: read with a deadline and a size cap, and
only a MAJOR.MINOR[.PATCH] version string is used.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

Version = tuple[int, int, int]

EXTRACT_FLOOR: Version = (0, 17, 0)
DEEPSEEK_FINAL_STATE_FLOOR: Version = (0, 25, 0)
# model_type values (the checkpoint's own, or its text_config's) of vLLM's DeepSeek-V2 model family
DEEPSEEK_FAMILY = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")
DEEPSEEK_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration")
VERSION_TIMEOUT_S = 5.0
VERSION_BODY_MAX = 64 * 1024
_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-].*)?$")


@dataclass(frozen=True)
class Floor:
    version: Version
    why: str

    @property
    def text(self) -> str:
        return ".".join(map(str, self.version))


def parse_version(text: str) -> Version | None:
    """MAJOR.MINOR[.PATCH] (a dev/local suffix allowed, e.g. 0.25.1.dev3+gabc); None when it is not one."""
    match = _VERSION_RE.match(text.strip()) if len(text) <= 100 else None
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def deepseek_family(model_types: tuple[str, ...], architectures: tuple[str, ...]) -> bool:
    return any(t in DEEPSEEK_FAMILY for t in model_types) or any(a in DEEPSEEK_ARCHITECTURES
                                                                  for a in architectures)


def extraction_floor(model_types: tuple[str, ...], architectures: tuple[str, ...] = ()) -> Floor:
    """The oldest vLLM an extraction server for this verifier runs on, and why (the module docstring)."""
    if deepseek_family(model_types, architectures):
        family = "/".join(t for t in model_types if t) or "/".join(architectures)
        return Floor(DEEPSEEK_FINAL_STATE_FLOOR,
                     f"the verifier is a DeepSeek-V2-family model ({family}) and vLLM returns its final "
                     f"layer's hidden state, which training reads, only from 0.25.0")
    return Floor(EXTRACT_FLOOR, "the extract_hidden_states method and its KV connector arrived in vLLM 0.17.0")


def refusal(version_text: str, floor: Floor, who: str = "the baseline") -> str | None:
    """Why a server of this version cannot extract (None: it can, or its version string is not one)."""
    version = parse_version(version_text)
    if version is None or version >= floor.version:
        return None
    return f"{who} reports vLLM {version_text.strip()}, extraction needs vLLM >= {floor.text}: {floor.why}"


UPGRADE = "upgrade vLLM on the host (the program the operator's unit runs) to {floor} or later"


def server_version(url: str, timeout: float = VERSION_TIMEOUT_S) -> tuple[str | None, str]:
    """(the version `GET url` reports, None when it did not answer one; a note saying what it answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (the plan's loopback endpoint)
            body = resp.read(VERSION_BODY_MAX + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"{url} did not answer ({type(exc).__name__})"
    if len(body) > VERSION_BODY_MAX:
        return None, f"{url}: answer over {VERSION_BODY_MAX // 1024} KiB"
    try:
        data: Any = json.loads(body)
    except ValueError:
        return None, f"{url}: not JSON"
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(version, str) or parse_version(version) is None:
        return None, f"{url}: no MAJOR.MINOR[.PATCH] version in the answer"
    return version, f"{url}: vLLM {version}"
