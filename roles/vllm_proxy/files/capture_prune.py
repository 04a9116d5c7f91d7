#!/usr/bin/python3
"""The bounds of the box's sample of its clients' requests (roles/vllm_proxy, vllm_proxy_capture), run as
root by its timer: what nginx captured since the last run is moved into the sample, then the sample keeps only
requests younger than the retention, and of those the newest that fit the byte budget.

nginx's master opens the capture log as root and its workers write through that descriptor, in append mode:
the log is read and truncated in place (no signal, no reopen, so the directory stays root's only); a request
written in the instant between the two is not kept. A line that is not a capture (a body nginx did not hold in
memory is logged empty) is dropped. Standard library only.

    capture_prune.py --dir /var/lib/specfleet/capture --max-bytes 104857600 --retention-days 7
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile

INCOMING = "incoming.log"
SAMPLE = "sample.jsonl"


def take_incoming(directory):
    """The lines nginx wrote since the last run, the log left empty."""
    path = os.path.join(directory, INCOMING)
    try:
        with open(path, "r+b") as log:
            text = log.read()
            log.truncate(0)
    except FileNotFoundError:
        return []
    return text.decode("utf-8", "replace").splitlines()


def captures(lines):
    """Each line that is a capture, as the sample keeps it: its time, path and request body (an object)."""
    for line in lines:
        try:
            logged = json.loads(line)
            body = json.loads(logged["body"])
            when = datetime.datetime.fromisoformat(logged["time"])
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(body, dict) and when.tzinfo is not None:
            yield {"time": when.isoformat(), "path": logged["path"], "body": body}


def read_sample(directory):
    try:
        with open(os.path.join(directory, SAMPLE), encoding="utf-8") as sample:
            return [json.loads(line) for line in sample if line.strip()]
    except FileNotFoundError:
        return []


def bounded(entries, now, max_bytes, retention_days):
    """The entries younger than the retention, newest first within max_bytes (as lines), in time order."""
    oldest = now - datetime.timedelta(days=retention_days)
    young = sorted(
        (entry for entry in entries if datetime.datetime.fromisoformat(entry["time"]) >= oldest),
        key=lambda entry: datetime.datetime.fromisoformat(entry["time"]),
    )
    kept, size = [], 0
    for entry in reversed(young):
        line = json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n"
        size += len(line.encode("utf-8"))
        if size > max_bytes:
            break
        kept.append(line)
    return kept[::-1]


def write_sample(directory, lines):
    """The sample replaced at once, root's only."""
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".sample-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as sample:
            sample.writelines(lines)
        os.chmod(temporary, 0o600)
        os.replace(temporary, os.path.join(directory, SAMPLE))
    except BaseException:
        os.unlink(temporary)
        raise


def prune(directory, max_bytes, retention_days, now=None):
    """One run: the sample's requests after it."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    lines = bounded(
        read_sample(directory) + list(captures(take_incoming(directory))), now, max_bytes, retention_days
    )
    write_sample(directory, lines)
    return len(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--retention-days", type=float, required=True)
    args = parser.parse_args(argv)
    kept = prune(args.dir, args.max_bytes, args.retention_days)
    print(f"capture: {kept} requests kept in {os.path.join(args.dir, SAMPLE)}")


if __name__ == "__main__":
    main()
