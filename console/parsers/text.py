"""The one sanitizer for text that comes from a host, a server or a profile.

Such text is data: it must never drive the terminal (CSI/OSC escape sequences can retitle it or write
the operator's clipboard), never break a line layout (other control characters), and never be longer
than a screen can use. It is applied where remote text enters the console's model (snapshots, journal
lines, action results), so every view and every headless output gets clean text; views still never
parse it as markup.
"""
from __future__ import annotations

import re

# CSI and OSC sequences whole (OSC ends at BEL or ST), any other ESC pair, C0/C1 controls but tab,
# lone surrogates (undecodable bytes kept by `surrogateescape`), and bidi overrides that reorder text.
_UNSAFE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b.?"
    r"|[\x00-\x08\x0a-\x1f\x7f-\x9f]"
    r"|[\u202a-\u202e\u2066-\u2069]"
)
_SURROGATES = re.compile(r"[\ud800-\udfff]")
MAX_TEXT = 4000  # one line of remote text: more than a screen, far less than a hostile megabyte


def clean(text: object, limit: int = MAX_TEXT) -> str:
    """One line of untrusted text, safe to print or show: escapes and controls removed, tabs as spaces,
    undecodable bytes as U+FFFD, cut to `limit` characters."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    if len(text) > 4 * limit:
        text = text[: 4 * limit]  # bound the regex work before cleaning
    text = _SURROGATES.sub("\ufffd", text)
    text = _UNSAFE.sub("", text.replace("\t", "    ").rstrip("\r\n"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clean_optional(text: object, limit: int = MAX_TEXT) -> str | None:
    return None if text is None else clean(text, limit)


def clean_block(text: object, limit: int = MAX_TEXT * 4) -> str:
    """Several lines of untrusted text (an error with its reasons): each line cleaned, newlines kept."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    lines = [clean(line, limit) for line in text[: 4 * limit].split("\n")]
    out = "\n".join(lines)
    return out if len(out) <= limit else out[: limit - 1] + "…"
