"""Time from a failed change being detected to the box serving its last known good again (prints
figures; not a test).

Creates its own box container (specfleet-bench-restore; SSH on loopback port 22125, the server on
18002), deploys (which records the last known good), then breaks it two ways and reads when each task
result came (the scenario driver's results): a bogus server flag (detected when readiness sees the
crash) and a drafter under the gate's floors (detected when the gate's smoke test fails). "Serving
again" is the restore's real completion. Removes the box after.

    .venv/bin/python bench/restore_timing.py
"""

import subprocess
import sys
import time
from pathlib import Path

import yaml
from sim_bench import box_vars

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from driver import run_playbook  # noqa: E402 (the scenario driver, from tests/)

BOX = "specfleet-bench-restore"
INVENTORY = box_vars(BOX, 22125, 18002)
GROUP_VARS = yaml.safe_load((ROOT / "inventory/local/group_vars/sim_boxes.yml").read_text())
# A restore should cost one server start and little more: failure detected -> serving again within
# this many times the restore's own start (its restart task to its readiness answer).
GOAL_OVER_ONE_START = 1.5
# The readiness check: it fails when the unit crashes, and answers ok once a real completion came.
READY = ("vllm_service", "vllm_service/tasks/ready.yml", "script")
GATE_MISSED = ("gate", "gate/tasks/main.yml", "speculation_gate")


def play(playbook, extra=None, tags=None):
    """Run a playbook against the bench box; returns (rc, its task results, wall seconds)."""
    started = time.monotonic()
    run = run_playbook(playbook, *INVENTORY, *(["--tags", tags] if tags else []), extra_vars=extra)
    return run.rc, run.results, time.monotonic() - started


def result_times(results, role, file, action, status):
    """When each matching result came (seconds since the epoch)."""
    return [
        r.ended
        for r in results
        if r.status == status and r.role == role and r.file.endswith(file) and r.action.endswith(action)
    ]


def time_to_serving(results, detected):
    """Seconds from the failed result to the last completion confirmed after the restore began."""
    restore = result_times(results, "transaction", "transaction/tasks/rollback.yml", "last_good", "ok")
    served = [t for t in result_times(results, *READY, "ok") if restore and t > restore[0]]
    if not (detected and restore and served):
        sys.exit("the run did not fail, restore and serve again as expected")
    return served[-1] - detected[-1], restore[0] - detected[-1]


def engine_start_s(results):
    """The restore's own server start: its restart task to the readiness check's answer."""
    restart = result_times(results, "vllm_service", "vllm_service/tasks/restart.yml", "systemd_service", "ok")
    served = result_times(results, *READY, "ok")
    return served[-1] - restart[-1]


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
            rc, results, wall = play("deploy.yml", extra, tags=tags)
            detected = result_times(results, *detection, "failed")
            rows.append((name, wall, *time_to_serving(results, detected), engine_start_s(results)))
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
