#!/usr/bin/python3
"""The live fallback (roles/spec_watch): run by a systemd timer on the box, one window per run.

Reads the server's spec-decode counters; a window is the traffic since the last counted one, and counts
once it holds at least `min_drafts` drafts (a quiet box waits for more traffic). When the mean acceptance
length of `windows` counted windows in a row lies under the box's gate floor at the k it drafts, it acts
once, holding the box's deploy lock as a deploy does: the box's last known good drafter back when another
one serves, else speculation off (a drop-in that starts the server without --speculative-config). What
it changed (the drop-in, its account of why) goes into the box's record, so that a later rollback puts the
fallback back with the rest of what served; it says so in one journal line and in a textfile metric. While
a deploy holds the lock it neither counts nor acts, and its textfile says so. The next deploy.yml reports
the fallback and keeps it, until a new drafter is shipped or the operator clears it.

Standard library only, with the repo's module_utils it imports installed beside it (specfleet_utils/).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from specfleet_utils import deploy_lock, last_good, prometheus_text, served_floors  # noqa: E402

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
# The speculative config as roles/vllm_service renders it: its own continuation line of ExecStart.
DROPIN_HEADER = (
    "# Written by specfleet's spec watcher: speculation off until a deploy ships another drafter.\n"
)
SPECULATIVE_ARGUMENT = re.compile(r" \\\n\s*--speculative-config '(?:[^'\\]|\\.)*'")


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_json(path, value, mode=0o600):
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    handle, staged = tempfile.mkstemp(dir=directory, prefix=".spec-watch-")
    with os.fdopen(handle, "w") as out:
        json.dump(value, out, indent=2, sort_keys=True)
    os.chmod(staged, mode)
    os.replace(staged, path)


def read_json(path, default=None):
    try:
        with open(path) as source:
            return json.load(source)
    except FileNotFoundError:
        return default


def counters(url):
    """(drafts, draft tokens, accepted tokens) summed over models and engines; None without speculation."""
    with urllib.request.urlopen(url, timeout=10) as response:
        samples = prometheus_text.parse_samples(response.read().decode())
    if not prometheus_text.select_samples(samples, DRAFTS):
        return None
    return [prometheus_text.sum_samples(samples, name) for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED)]


class Refused(Exception):
    """Another run holds the box's lock."""


class LockCaller:
    """What deploy_lock asks of its caller (an Ansible module's fail_json and check mode)."""

    check_mode = False

    @staticmethod
    def fail_json(msg, **_):
        raise Refused(msg)


def textfile(config, state, acted, read=True, locked=False):
    """The watcher's state for node_exporter's textfile collector; `read`: whether this run read the
    server's metrics (a watcher that cannot is blind, and says so here for an alert); `locked`: whether a
    deploy held the box, so that this run neither counted nor acted."""
    if not config.get("textfile_dir") or not os.path.isdir(config["textfile_dir"]):
        return
    lines = [
        "# HELP specfleet_spec_watch_metrics_read Whether the watcher's last run read the server's metrics.",
        "# TYPE specfleet_spec_watch_metrics_read gauge",
        f"specfleet_spec_watch_metrics_read {1 if read else 0}",
        "# HELP specfleet_spec_watch_deploy_held Whether a deploy held the box's lock at the last run.",
        "# TYPE specfleet_spec_watch_deploy_held gauge",
        f"specfleet_spec_watch_deploy_held {1 if locked else 0}",
        "# HELP specfleet_spec_watch_below_floor_windows Counted windows in a row under the gate floor.",
        "# TYPE specfleet_spec_watch_below_floor_windows gauge",
        f"specfleet_spec_watch_below_floor_windows {state.get('streak', 0)}",
        "# HELP specfleet_spec_watch_acted The watcher's fallback, 1 while in force.",
        "# TYPE specfleet_spec_watch_acted gauge",
    ]
    action = (acted or {}).get("action", "none")
    lines.append(f'specfleet_spec_watch_acted{{action="{action}"}} {1 if acted else 0}')
    path = os.path.join(config["textfile_dir"], "specfleet_spec_watch.prom")
    handle, staged = tempfile.mkstemp(dir=config["textfile_dir"], prefix=".specfleet_spec_watch.")
    with os.fdopen(handle, "w") as out:
        out.write("\n".join(lines) + "\n")
    os.chmod(staged, 0o644)
    os.replace(staged, path)


def window(state, current):
    """The window since the last counted one: (drafts, k, mean acceptance length), or None across a
    restart (the counters start again)."""
    before = state.get("counters")
    if not before or any(now_ < then for now_, then in zip(current, before)):
        return None
    drafts, draft_tokens, accepted = (now_ - then for now_, then in zip(current, before))
    if drafts <= 0:
        return (0, 0, None)
    return (drafts, draft_tokens / drafts, 1 + accepted / drafts)


def act(config, reason, run=subprocess.run):
    """Once, under the box's lock: the last known good drafter back when another one serves, else
    speculation off; what it changed recorded into the box's record. Raises Refused while a deploy holds
    the lock."""
    token = uuid.uuid4().hex
    deploy_lock.hold(
        LockCaller, config["lock_file"], f"spec watch (pid {os.getpid()})", token, config["lock_stale_s"]
    )
    try:
        acted = fall_back(config, reason)
        # Into the box's record: a later rollback puts the fallback back with the rest of what served.
        last_good.merge_files(config["record_dir"], config["record_files"])
    finally:
        deploy_lock.release(LockCaller, config["lock_file"], token)
    for command in (
        ["daemon-reload"],
        ["reset-failed", config["unit"]],
        ["restart", "--no-block", config["unit"]],
    ):
        run(["systemctl", *command], check=False)
    return acted


def fall_back(config, reason):
    """The drafter link or the drop-in, and the account of why."""
    current = os.path.realpath(config["drafter_link"])
    recorded = (last_good.read(config["record_dir"]) or {}).get("links", {}).get("drafter")
    if recorded and os.path.realpath(recorded) != current and os.path.isdir(recorded):
        staged = config["drafter_link"] + ".spec-watch"
        if os.path.lexists(staged):
            os.unlink(staged)
        os.symlink(recorded, staged)
        os.replace(staged, config["drafter_link"])
        action = "last_good_drafter"
    else:
        with open(config["unit_file"]) as unit:
            text = unit.read()
        start = re.search(r"^ExecStart=(?:.*\\\n)*.*$", text, re.M)
        command = SPECULATIVE_ARGUMENT.sub("", start.group(0))
        os.makedirs(os.path.dirname(config["dropin"]), exist_ok=True)
        with open(config["dropin"] + ".partial", "w") as out:
            # What roles/vllm_service renders while a deploy keeps this fallback (speculation-off.conf.j2),
            # byte for byte: a deploy that changes nothing else then leaves it, and the server, alone.
            out.write(f"{DROPIN_HEADER}[Service]\nExecStart=\n{command}\n")
        os.replace(config["dropin"] + ".partial", config["dropin"])
        action = "speculation_off"
    # What serves from now on: a deploy that ships another drafter (or spec_watch_clear) ends the fallback.
    serving = os.path.realpath(config["drafter_link"])
    acted = {"action": action, "at": now(), "reason": reason, "judged": current, "serving": serving}
    write_json(config["action_file"], acted)
    return acted


def tick(config, run=subprocess.run):
    """One timer run; returns the line it logs."""
    acted = read_json(config["action_file"])
    state = read_json(config["state_file"], {})
    if acted:
        textfile(config, state, acted)
        return f"spec watch: {acted['action']} since {acted['at']} ({acted['reason']}); waiting for a deploy"
    if os.path.exists(config["lock_file"]):
        textfile(config, state, None, locked=True)
        return "spec watch: a deploy holds this box; not watching this window"
    try:
        current = counters(config["metrics_url"])
    except OSError as error:
        textfile(config, state, None, read=False)
        return f"spec watch: {config['metrics_url']} did not answer ({error}); nothing counted"
    if current is None:
        textfile(config, {}, None)
        return "spec watch: the server does not speculate; nothing to watch"
    measured, locked = window(state, current), False
    if measured is None:
        state = {"counters": current, "streak": 0}
        line = "spec watch: counting from here (first run, or the server restarted)"
    elif measured[0] < config["min_drafts"]:
        line = (
            f"spec watch: {measured[0]:.0f} drafts since the last window, waiting for {config['min_drafts']}"
        )
    else:
        drafts, k, length = measured
        floor = served_floors.floor_at(config["floors_by_k"], "mean_acceptance_length", k)
        below = floor is not None and length < floor
        state = {"counters": current, "streak": state.get("streak", 0) + 1 if below else 0}
        line = (
            f"spec watch: mean acceptance length {length:.2f} over {drafts:.0f} drafts at k={k:.2f}, "
            f"floor {floor if floor is None else round(floor, 2)}; "
            f"{state['streak']} of {config['windows']} windows under it"
        )
        if state["streak"] >= config["windows"]:
            reason = (
                f"mean acceptance length {length:.2f} < floor {floor:.2f} at k={k:.2f} for {state['streak']} "
                f"windows of at least {config['min_drafts']} drafts"
            )
            try:
                acted = act(config, reason, run)
                line = f"spec watch: {acted['action']}: {reason}"
            except Refused:
                # A deploy took the box while this window was read: it decides what serves now.
                locked = True
                line += "; a deploy took the box meanwhile, not acting"
    write_json(config["state_file"], state)
    textfile(config, state, acted, locked=locked)
    return line


def main():
    with open(sys.argv[1]) as source:
        config = json.load(source)
    print(tick(config), flush=True)


if __name__ == "__main__":
    main()
