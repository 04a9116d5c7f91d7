"""What preflight reads on the box, in one call (the box's Python, standard library).

argv[1], JSON: disk_paths (free space of each), paths (what each is), ports with the units allowed to
hold them, config (a JSON file to read, or null), python (the interpreter vLLM's virtualenv is made
with) and release (a release to ship, {releases, release_id}, or null). Prints JSON:
  free:   {path: bytes available to unprivileged users, as df counts them, or the reason it cannot tell}
  paths:  {path: "link", "directory", "file" or null (absent)}
  ports:  {port: null when free or held only by the units' processes, else who holds it}
  config: the file's JSON, or null when there is no such file
  python: {version: that interpreter's "X.Y.Z", or null where the box has none by that name, machine}
  release: {published: whether <releases>/<release_id> exists, staged: bytes already in its .partial (an
           interrupted transfer resumes there), free: bytes free where <releases> is or will be}, or null
"""

import json
import os
import platform
import re
import subprocess
import sys


def free_bytes(path):
    try:
        stats = os.statvfs(path)
    except OSError as error:
        return error.strerror
    return stats.f_bavail * stats.f_frsize


def kind(path):
    if os.path.islink(path):
        return "link"
    if os.path.isdir(path):
        return "directory"
    return "file" if os.path.exists(path) else None


def port_holder(port, units):
    """None when nothing listens on the TCP port or only the units' processes do, else who holds it."""
    listeners = subprocess.run(
        ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not listeners:
        return None
    pids = sorted({int(pid) for pid in re.findall(r"pid=(\d+)", listeners)})
    if not pids:
        # Without CAP_SYS_PTRACE (e.g. in a container) ss cannot name other users' processes: then an
        # active unit is taken to be the holder, since it could not run with its port taken.
        active = subprocess.run(["systemctl", "is-active", "--quiet", *units], check=False).returncode == 0
        return None if active else "held by a process ss cannot name"
    others = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8") as cgroup:
                if any(line.rstrip("\n").endswith(tuple(f"/{unit}" for unit in units)) for line in cgroup):
                    continue
            with open(f"/proc/{pid}/comm", encoding="utf-8") as comm:
                name = comm.read().strip()
        except OSError:
            continue  # gone since ss listed it
        others.append(f"{name}[pid {pid}]")
    return f"held by {' '.join(others)}" if others else None


def config(path):
    try:
        with open(path, encoding="utf-8") as text:
            return json.load(text)
    except FileNotFoundError:
        return None


def python(name):
    try:
        version = subprocess.run(
            [name, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        version = None
    return {"version": version, "machine": platform.machine()}


def release(releases, release_id):
    """Where a release to ship would go: whether it is there, what is staged of it, the room for it."""
    staged = 0
    for root, _, files in os.walk(os.path.join(releases, f"{release_id}.partial")):
        staged += sum(os.lstat(os.path.join(root, name)).st_size for name in files)
    existing = releases
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    return {
        "published": os.path.isdir(os.path.join(releases, release_id)),
        "staged": staged,
        "free": free_bytes(existing),
    }


want = json.loads(sys.argv[1])
print(
    json.dumps(
        {
            "free": {path: free_bytes(path) for path in want["disk_paths"]},
            "paths": {path: kind(path) for path in want["paths"]},
            "ports": {str(port): port_holder(port, want["units"]) for port in want["ports"]},
            "config": config(want["config"]) if want["config"] else None,
            "python": python(want["python"]),
            "release": release(**want["release"]) if want["release"] else None,
        }
    )
)
