#!/usr/bin/python3
"""Print an apt Packages index for the .deb files of one directory (a flat repository).

Stdlib and dpkg-deb only, so a box without dpkg-dev or apt-utils can index a local directory.
Usage: deb_index.py DIRECTORY
"""

import hashlib
import subprocess
import sys
from pathlib import Path


def stanza(deb: Path) -> str:
    fields = subprocess.run(["dpkg-deb", "--field", str(deb)], check=True, capture_output=True, text=True)
    control = fields.stdout
    digest = hashlib.sha256(deb.read_bytes()).hexdigest()
    return f"{control.rstrip()}\nFilename: ./{deb.name}\nSize: {deb.stat().st_size}\nSHA256: {digest}\n"


def main(directory: str) -> None:
    debs = sorted(Path(directory).glob("*.deb"))
    if not debs:
        sys.exit(f"no .deb files in {directory}")
    sys.stdout.write("\n".join(stanza(deb) for deb in debs))


if __name__ == "__main__":
    main(sys.argv[1])
