"""roles/nvidia_cuda/files/deb_index.py: the Packages index of a directory of .debs (air-gapped boxes)."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import script_module

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "nvidia_cuda" / "files" / "deb_index.py"
deb_index = script_module.load(SCRIPT, "deb_index")

# In CI (CI=true) a missing dpkg-deb fails these tests instead of skipping them.
pytestmark = pytest.mark.skipif(
    shutil.which("dpkg-deb") is None and os.environ.get("CI") != "true", reason="needs dpkg-deb"
)


def build_deb(directory, name, version, depends=""):
    root = directory / f"build-{name}-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    control = f"Package: {name}\nVersion: {version}\nArchitecture: amd64\nMaintainer: t <t@t.invalid>\n"
    if depends:
        control += f"Depends: {depends}\n"
    control += "Description: test package\n two lines\n"
    (root / "DEBIAN" / "control").write_text(control)
    deb = directory / f"{name}_{version}_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True, capture_output=True
    )
    shutil.rmtree(root)
    return deb


def parse(index):
    return [
        dict(line.split(": ", 1) for line in stanza.splitlines() if not line.startswith(" "))
        for stanza in index.split("\n\n")
    ]


def test_one_stanza_per_deb_with_filename_size_and_sha256(tmp_path):
    old = build_deb(tmp_path, "nvidia-open-575", "575.57.08-1", "nvidia-persistenced (= 575.57.08-1)")
    new = build_deb(tmp_path, "nvidia-open-575", "575.64.03-1")
    (tmp_path / "notes.txt").write_text("not a package")
    stanzas = parse("\n".join(deb_index.stanza(deb) for deb in (old, new)))
    assert [(s["Package"], s["Version"]) for s in stanzas] == [
        ("nvidia-open-575", "575.57.08-1"),
        ("nvidia-open-575", "575.64.03-1"),
    ]
    assert stanzas[0]["Depends"] == "nvidia-persistenced (= 575.57.08-1)"
    assert stanzas[0]["Filename"] == f"./{old.name}"
    assert int(stanzas[0]["Size"]) == old.stat().st_size
    assert stanzas[0]["SHA256"] == hashlib.sha256(old.read_bytes()).hexdigest()


def test_script_prints_the_index_of_every_deb_sorted(tmp_path):
    build_deb(tmp_path, "b-pkg", "1.0")
    build_deb(tmp_path, "a-pkg", "2.0")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], check=True, capture_output=True, text=True
    )
    assert [s["Package"] for s in parse(out.stdout)] == ["a-pkg", "b-pkg"]
    # Stanzas are separated by exactly one blank line, as apt expects.
    assert "\n\n\n" not in out.stdout and out.stdout.endswith("\n")


def test_empty_directory_is_refused(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "no .deb files" in result.stderr
