"""Wheels that hold only their package metadata (and the WHEEL file pip checks), made from the real METADATA
in tests/fixtures/metadata: vLLM 0.33.0's and torch 2.14.0's and 2.8.0's, as PyPI serves them; and the same
metadata as the PEP 658 files an index serves beside each wheel (`<wheel file name>.metadata`). Metadata is
all that roles/preflight's release check (action_plugins/release_requirements.py) reads of a wheel."""

import zipfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures/metadata"


def metadata_wheel(path, metadata):
    dist_info = "-".join(path.name.split("-")[:2]) + ".dist-info"
    tag = "-".join(path.stem.split("-")[2:])
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{dist_info}/METADATA", metadata)
        wheel.writestr(f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")


def releases(python="cp312", machine="x86_64"):
    """{wheel file name: METADATA text} of vLLM 0.33.0 and the torch releases of the fixtures, torch's for
    the box's Python (`python`, its tag: torch's requirements are the same for each) and machine."""
    found = {
        f"vllm-0.33.0-cp38-abi3-manylinux_2_28_{machine}.whl": (FIXTURES / "vllm-0.33.0.METADATA").read_text()
    }
    for torch in ("2.14.0", "2.8.0"):
        fixture = next(FIXTURES.glob(f"torch-{torch}-*.METADATA"))
        found[f"torch-{torch}-{python}-{python}-manylinux_2_28_{machine}.whl"] = fixture.read_text()
    return found


def wheelhouse(directory, python="cp312", machine="x86_64"):
    """A directory of the releases' metadata-only wheels."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, metadata in releases(python, machine).items():
        metadata_wheel(directory / name, metadata)
    return directory


def metadata_files(directory, python="cp312", machine="x86_64"):
    """A directory of the releases' metadata files, each named as an index serves it: its wheel's file name
    and `.metadata`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, metadata in releases(python, machine).items():
        (directory / f"{name}.metadata").write_text(metadata)
    return directory
