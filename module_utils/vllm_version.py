"""The installed vLLM version as a comparable (major, minor, micro) tuple (standard library only)."""

import re

__all__ = ["VERSION_RE", "parse_vllm_version"]

VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_vllm_version(text):
    """'0.32.0+cpu' -> (0, 32, 0), '1.0' -> (1, 0, 0); pre-release, dev and local tags are ignored.

    Raises ValueError ("'<text>' is not a version like 0.33.0") when `text` does not start with
    major.minor; callers put what the text was in front of that.
    """
    match = VERSION_RE.match(text or "")
    if not match:
        raise ValueError(f"{text!r} is not a version like 0.33.0")
    return tuple(int(part or 0) for part in match.groups())
