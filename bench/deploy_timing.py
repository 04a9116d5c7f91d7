"""Deploy timings on a fresh simulated GPU box (prints figures; not a test).

Creates its own box container (specfleet-bench; SSH on loopback port 22124, the server on 18001),
then measures: the first deploy.yml run, a second no-change run (and that run without the gate's smoke
test, which is reported beside it: goal <= 10% of the first), and vLLM's own time from process start to
"Application startup complete" inside the first run; then a new drafter shipped with --tags eagle3,
against the engine's own restart time inside it (goal: the play's overhead over it <= 15 s). Removes
the box after.

    .venv/bin/python bench/deploy_timing.py
"""

import json
import re
import subprocess

from sim_bench import ROOT, box_vars, playbook

BOX = "specfleet-bench"
# Reached over SSH like the default box, on ports of its own.
EXTRA = box_vars(BOX, 22124, 18001)
# profile_tasks lists every task, not only the slowest 20.
EVERY_TASK = {"PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all"}


def smoke_seconds(output):
    """The gate's measuring tasks of a run (the smoke test, and the baseline when one is measured)."""
    recap = output.split("TASKS RECAP", 1)[-1]
    return sum(
        float(m) for m in re.findall(r"^gate : Gate \| (?:Smoke-test|Baseline).*?-+ ([0-9.]+)s$", recap, re.M)
    )


def box(*command):
    return subprocess.run(
        ["podman", "exec", BOX, *command], capture_output=True, text=True, check=True
    ).stdout


def vllm_time_to_ready():
    """Seconds from the server process start to uvicorn's startup message, from the journal."""
    entries = [json.loads(line) for line in box("journalctl", "-u", "vllm", "-o", "json").splitlines()]
    starts = [
        int(e["__MONOTONIC_TIMESTAMP"])
        for e in entries
        if str(e.get("MESSAGE", "")).startswith("Started vllm.service")
    ]
    ready = [
        int(e["__MONOTONIC_TIMESTAMP"])
        for e in entries
        if "Application startup complete" in str(e.get("MESSAGE", ""))
    ]
    return (ready[-1] - starts[-1]) / 1e6


def main():
    subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)
    try:
        playbook(EXTRA, "sim/start.yml")
        first, first_recap, _ = playbook(EXTRA, "deploy.yml")
        second, second_recap, second_out = playbook(EXTRA, "deploy.yml", env=EVERY_TASK)
        smoke = smoke_seconds(second_out)
        print(f"first deploy.yml on a fresh box : {first:7.1f} s   ({first_recap})")
        print(f"second run, nothing to change   : {second:7.1f} s   ({second_recap})")
        print(f"  of which the gate's smoke test: {smoke:7.1f} s")
        print(f"  without it, share of the first: {(second - smoke) / first:7.1%}   (goal <= 10%)")
        print(f"vLLM start to ready (in run 1)  : {vllm_time_to_ready():7.1f} s")
        drafter = ROOT / "build/sim-models/eagle3-known-3.0"
        ship, ship_recap, ship_out = playbook(
            EXTRA,
            # under the 3.4 drafter's best record: shipped knowingly, as the timing is the point
            "deploy.yml",
            "--tags",
            "eagle3",
            "-e",
            f"eagle3_drafter_source={drafter}",
            "-e",
            "gate_max_regression=0",
            env=EVERY_TASK,
        )
        restart = vllm_time_to_ready()
        print(f"--tags eagle3, new drafter      : {ship:7.1f} s   ({ship_recap})")
        print(f"  engine restart to ready       : {restart:7.1f} s")
        print(f"  overhead of the play          : {ship - restart:7.1f} s (goal <= 15 s)")
        print(f"  of which the gate's smoke test: {smoke_seconds(ship_out):7.1f} s")
    finally:
        subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)


if __name__ == "__main__":
    main()
