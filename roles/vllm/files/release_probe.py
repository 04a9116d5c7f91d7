"""What the vllm role needs to know of the box, in one call (the box's Python, standard library).

argv[1], JSON: the release's virtualenv, completion marker and package, the distributions that must not
be in it, the service user and its home, the Debian packages the release needs, and the releases
directory. Prints JSON: the package's version ("none" without a virtualenv, "incomplete" without the
marker), the virtualenv's site-packages, which unwanted distributions are present, the version of the
"vllm" alias distribution (none without it), whether the service user is as the role makes it, the
packages not installed, and the releases.
"""

import glob
import importlib.metadata
import json
import os
import pwd
import subprocess
import sys


def version(name, site_packages):
    """A distribution's version in that site-packages, read from its metadata (nothing imported)."""
    found = next(iter(importlib.metadata.distributions(name=name, path=[site_packages])), None)
    return found.version if found else None


def user_as_made(name, home):
    """The user exists as the role's user task makes it: that home, present, and no login shell."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return False
    return entry.pw_dir == home and os.path.isdir(home) and entry.pw_shell == "/usr/sbin/nologin"


def not_installed(packages):
    """The Debian packages dpkg does not list as installed."""
    if not packages:
        return []
    listed = subprocess.run(
        ["dpkg-query", "--show", "--showformat", "${Package} ${db:Status-Status}\\n", *packages],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split("\n")
    installed = {line.split()[0] for line in listed if line.endswith(" installed")}
    return [package for package in packages if package not in installed]


def releases(directory):
    """Each release directory with its mtime, as the find module would list them."""
    if not os.path.isdir(directory):
        return []
    with os.scandir(directory) as entries:
        return [
            {"path": entry.path, "mtime": entry.stat().st_mtime}
            for entry in entries
            if entry.is_dir(follow_symlinks=False)
        ]


def release_version(want, site_packages):
    if not site_packages:
        return "none"
    return version(want["package"], site_packages) if os.path.exists(want["marker"]) else "incomplete"


want = json.loads(sys.argv[1])
found = sorted(glob.glob(os.path.join(glob.escape(want["venv"]), "lib*", "python3*", "site-packages")))
site_packages = found[0] if found else ""
print(
    json.dumps(
        {
            "version": release_version(want, site_packages),
            "site_packages": site_packages,
            "unwanted": [name for name in want["unwanted"] if site_packages and version(name, site_packages)],
            "alias": version("vllm", site_packages) if site_packages else None,
            "user_as_made": user_as_made(want["user"], want["home"]),
            "packages_missing": not_installed(want["system_packages"]),
            "releases": releases(want["releases_dir"]),
        }
    )
)
