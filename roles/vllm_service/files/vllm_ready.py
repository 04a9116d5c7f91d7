#!/usr/bin/python3
"""Wait up to --wait seconds for a vLLM unit to answer /health, failing fast if it crashed.

Exit 0: /health answered 200. Exit 3: still loading (poll again). Exit 1: the unit failed or
systemd restarted it after a crash (waiting longer cannot help). Runs with the box's Python.
"""

import argparse
import subprocess
import sys
import time
import urllib.error
import urllib.request


def unit_state(unit):
    out = subprocess.run(
        ["systemctl", "show", unit, "--property=ActiveState,SubState,NRestarts"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def healthy(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--unit", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--wait", type=float, default=30)
    args = parser.parse_args()

    deadline = time.monotonic() + args.wait
    while True:
        state = unit_state(args.unit)
        # NRestarts counts automatic restarts since the last explicit start: each one is a crash.
        if state.get("ActiveState") == "failed" or int(state.get("NRestarts", "0")) > 0:
            print(
                f"{args.unit} crashed ({state.get('ActiveState')}/{state.get('SubState')}, "
                f"{state.get('NRestarts')} automatic restarts)"
            )
            return 1
        if state.get("ActiveState") == "inactive":
            print(f"{args.unit} is not running")
            return 1
        if healthy(args.url):
            print(f"{args.url} answered 200")
            return 0
        if time.monotonic() >= deadline:
            print(f"{args.unit} still loading ({state.get('ActiveState')}/{state.get('SubState')})")
            return 3
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
