"""Time from a failed change being detected to the box serving its last known good again (prints
figures; not a test).

Creates its own box container (specfleet-bench-restore; SSH on loopback port 22125, the server on
18002), deploys (which records the last known good), then breaks it two ways and reads ansible's own
event times: a bogus server flag (detected when readiness sees the crash) and a drafter under the
gate's floors (detected when the gate's smoke test fails). "Serving again" is the restore's real
completion. Removes the box after.

    .venv/bin/python bench/restore_timing.py
"""

import datetime
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ansible_runner
import yaml
from sim_bench import box_vars

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BOX = "specfleet-bench-restore"
INVENTORY = box_vars(BOX, 22125, 18002)
GROUP_VARS = yaml.safe_load((ROOT / "inventory/local/group_vars/sim_boxes.yml").read_text())
# A restore should cost one server start and little more: failure detected -> serving again within
# this many times the restore's own start (its restart task to its readiness answer).
GOAL_OVER_ONE_START = 1.5
# The readiness check: it fails when the unit crashes, and answers ok once a real completion came.
READY = ("vllm_service", "vllm_service/tasks/ready.yml", "script")
GATE_MISSED = ("gate", "gate/tasks/main.yml", "vllm_spec_smoke")


def play(playbook, extra=None, tags=None):
    """Run a playbook against the bench box; returns (rc, events, wall seconds)."""
    with tempfile.TemporaryDirectory() as private:
        started = time.monotonic()
        runner = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(ROOT),
            playbook=str(ROOT / playbook),
            cmdline=shlex.join(INVENTORY),
            extravars=extra or {},
            tags=tags,
            envvars={"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
            quiet=True,
        )
        events = list(runner.events)
        return runner.rc, events, time.monotonic() - started


def when(event):
    return datetime.datetime.fromisoformat(event["created"])


def event_times(events, role, file, action, kind):
    return [
        when(e)
        for e in events
        if e["event"] == kind
        and e.get("event_data", {}).get("role") == role
        and e["event_data"].get("task_path", "").rsplit(":", 1)[0].endswith(file)
        and (e["event_data"].get("resolved_action") or e["event_data"].get("task_action", "")).endswith(
            action
        )
    ]


def time_to_serving(events, detected):
    """Seconds from the failure's event to the last completion confirmed after the restore began."""
    restore = event_times(events, "last_good", "last_good/tasks/restore.yml", "last_good", "runner_on_ok")
    served = [t for t in event_times(events, *READY, "runner_on_ok") if restore and t > restore[0]]
    if not (detected and restore and served):
        sys.exit("the run did not fail, restore and serve again as expected")
    return (served[-1] - detected[-1]).total_seconds(), (restore[0] - detected[-1]).total_seconds()


def engine_start_s(events):
    """The restore's own server start: its restart task to the readiness check's answer."""
    restart = event_times(
        events, "last_good", "last_good/tasks/restore.yml", "systemd_service", "runner_on_ok"
    )
    served = event_times(events, *READY, "runner_on_ok")
    return (served[-1] - restart[-1]).total_seconds()


def main():
    rc, _, _ = play("sim/start.yml")
    try:
        if rc != 0 or play("deploy.yml")[0] != 0:
            sys.exit("could not start and deploy the bench box")
        bogus = [*GROUP_VARS["vllm_service_extra_args"], "--bogus-flag"]
        drafter = str(ROOT / "build/sim-models/eagle3-known-1.4")
        cases = [
            # name, extra vars, tags, where the failure is detected (role, file, module)
            (
                "bogus server flag (--tags service)",
                {"vllm_service_extra_args": bogus},
                "service",
                READY,
            ),
            ("drafter under the gate's floors", {"eagle3_drafter_source": drafter}, "eagle3", GATE_MISSED),
        ]
        rows = []
        for name, extra, tags, detection in cases:
            rc, events, wall = play("deploy.yml", extra, tags=tags)
            detected = event_times(events, *detection, "runner_on_failed")
            rows.append((name, wall, *time_to_serving(events, detected), engine_start_s(events)))
        print(f"{'failed change':<36} {'run':>7} {'serving':>9} {'restore':>9} {'a start':>9} {'ratio':>6}")
        for name, wall, serving, restore, start in rows:
            ratio = serving / start
            verdict = "ok" if ratio <= GOAL_OVER_ONE_START else "OVER"
            figures = f"{wall:6.1f}s {serving:8.1f}s {restore:8.1f}s {start:8.1f}s {ratio:5.2f}x"
            print(f"{name:<36} {figures} {verdict}")
        print(f"goal: failure detected -> serving again <= {GOAL_OVER_ONE_START}x the restore's server start")
    finally:
        subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)


if __name__ == "__main__":
    main()
