"""A one-line excerpt of command output or of an HTTP body, for an error message (standard library only)."""

__all__ = ["EXCERPT_CHARS", "excerpt"]

EXCERPT_CHARS = 200


def excerpt(text, limit=EXCERPT_CHARS, empty="(no output)"):
    """`text` on one line (whitespace collapsed), cut to `limit` characters with "..."; `empty` if blank."""
    flat = " ".join(str(text or "").split())
    if not flat:
        return empty
    return flat if len(flat) <= limit else flat[:limit] + "..."
