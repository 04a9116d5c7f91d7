"""A real headless browser (Debian's chromium) for pages the repo writes: the DOM after load, and a
screenshot read back as pixels (Pillow), so a test sees what renders, not only the source."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from PIL import Image

CHROMIUM = shutil.which("chromium")
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]


def _run(*args: str) -> str:
    with tempfile.TemporaryDirectory(prefix="specfleet-chromium-") as profile:
        result = subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def dom(page: Path) -> str:
    """The document as chromium has it after loading the page."""
    return _run("--dump-dom", page.resolve().as_uri())


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 1800) -> Path:
    _run(f"--screenshot={png}", f"--window-size={width},{height}", page.resolve().as_uri())
    assert png.exists() and png.stat().st_size > 0, png
    return png


def colours(png: Path) -> dict[tuple[int, int, int], int]:
    """How many pixels of the screenshot have each RGB colour."""
    with Image.open(png) as image:
        return {colour: count for count, colour in image.convert("RGB").getcolors(maxcolors=1 << 24)}
