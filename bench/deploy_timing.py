"""Deploy timings on a fresh simulated GPU box (prints figures; not a test).

Creates its own box container (specfleet-bench; SSH on loopback port 22124, the server on 18001),
then measures: the first deploy.yml run, three no-change runs (the median without the gate's smoke test,
which is reported beside it: goal <= 10% of the first; and the calls it makes to the box), and
vLLM's own time from process start to "Application startup complete" inside the first run; then a new
drafter shipped with --tags eagle3, three times (new releases of one drafter; the median), against the
engine's own restart inside each, from systemd stopping the old server to the new one's startup message
(goal: the play's overhead over it <= 15 s). Removes the box after.

    .venv/bin/python bench/deploy_timing.py
"""

import datetime
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from sim_bench import CONTROLLER_ACTIONS, ROOT, box_vars, playbook

BOX = "specfleet-bench"
# Reached over SSH like the default box, on ports of its own.
EXTRA = box_vars(BOX, 22124, 18001)
NO_CHANGE_RUNS = 3
SHIPS = 3
# Results as JSON (each task's host result and duration): what ran on the box is counted from them.
AS_JSON = {
    "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
    "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.timer",
}


def task_results(output, host="sim-gpu-box"):
    """(action, seconds, result) of each task the run gave the box, from the JSON callback's output."""
    report, _ = json.JSONDecoder().raw_decode(output[output.index("{") :])
    for play in report["plays"]:
        for task in play["tasks"]:
            if host in task["hosts"]:
                span = {at: datetime.datetime.fromisoformat(t) for at, t in task["task"]["duration"].items()}
                seconds = (span["end"] - span["start"]).total_seconds()
                result = task["hosts"][host]
                yield result.get("action", ""), seconds, result


def smoke_seconds(output):
    """The gate's measuring calls of a run (the smoke test, and the baseline when one is measured)."""
    return sum(seconds for action, seconds, _ in task_results(output) if action == "speculation_gate")


def round_trips(output):
    """Module runs on the box: each task (or loop item) not skipped that is not carried out on the
    controller or delegated to it."""
    count = 0
    for action, _, result in task_results(output):
        if result.get("skipped") or action in CONTROLLER_ACTIONS or "_ansible_delegated_vars" in result:
            continue
        count += sum(not item.get("skipped") for item in result.get("results", [result]))
    return count


def box(*command):
    return subprocess.run(
        ["podman", "exec", BOX, *command], capture_output=True, text=True, check=True
    ).stdout


def vllm_seconds():
    """From the journal: (seconds from the server process's last start to uvicorn's startup message,
    seconds from systemd stopping the server before it to the same message: a restart is both)."""
    entries = [json.loads(line) for line in box("journalctl", "-u", "vllm", "-o", "json").splitlines()]

    def times(starts_with):
        return [
            int(e["__MONOTONIC_TIMESTAMP"])
            for e in entries
            if str(e.get("MESSAGE", "")).startswith(starts_with)
        ]

    started, ready = max(times("Started vllm.service")), max(times("INFO:     Application startup complete"))
    stopped = max([t for t in times("Stopping vllm.service") if t < started], default=started)
    return (ready - started) / 1e6, (ready - stopped) / 1e6


def new_release(drafter, copy, under):
    """A copy of a small drafter that is a release of its own: its config has one more key (vLLM ignores it),
    so its content manifest, and the release id, differ from every other."""
    target = Path(under) / f"{drafter.name}-copy{copy}"
    shutil.copytree(drafter, target)
    config = target / "config.json"
    settings = json.loads(config.read_text())
    config.write_text(json.dumps({**settings, "specfleet_bench_copy": copy}, indent=2) + "\n")
    return target


def main():
    subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)
    try:
        playbook(EXTRA, "sim/start.yml")
        first, first_recap, _ = playbook(EXTRA, "deploy.yml")
        # Three no-change runs: one alone moves with whatever else this shared machine does.
        runs = [playbook(EXTRA, "deploy.yml", env=AS_JSON) for _ in range(NO_CHANGE_RUNS)]
        without_smoke = sorted((seconds - smoke_seconds(out), seconds, out) for seconds, _, out in runs)
        rest, second, second_out = without_smoke[len(without_smoke) // 2]
        print(f"first deploy.yml on a fresh box : {first:7.1f} s   ({first_recap})")
        tasks = len(list(task_results(second_out)))
        print(
            f"no-change runs, the median      : {second:7.1f} s   ({tasks} tasks; all "
            f"{', '.join(f'{seconds:.1f}' for seconds, _, _ in runs)} s)"
        )
        print(f"  of which calls to the box     : {round_trips(second_out):7d}")
        print(f"  of which the gate's smoke test: {second - rest:7.1f} s")
        print(f"  without it, share of the first: {rest / first:7.1%}   (goal <= 10%)")
        print(f"vLLM start to ready (in run 1)  : {vllm_seconds()[0]:7.1f} s")
        # New releases of the 3.0 drafter, one per ship (its config with a key of its own), shipped under
        # the 3.4 drafter's best record knowingly, as the timing is the point; the median of three.
        ships = []
        with tempfile.TemporaryDirectory(prefix="specfleet-bench-drafters-") as copies:
            for copy in range(1, SHIPS + 1):
                drafter = new_release(ROOT / "build/sim-models/eagle3-known-3.0", copy, copies)
                ship, _, ship_out = playbook(
                    EXTRA,
                    "deploy.yml",
                    "--tags",
                    "eagle3",
                    "-e",
                    f"eagle3_drafter_source={drafter}",
                    "-e",
                    "gate_max_regression=0",
                    env=AS_JSON,
                )
                start, restart = vllm_seconds()
                ships.append((ship - restart, ship, restart, start, ship_out))
        overhead, ship, restart, start, ship_out = sorted(ships, key=lambda s: s[0])[len(ships) // 2]
        tasks = len(list(task_results(ship_out)))
        print(
            f"--tags eagle3, new drafter      : {ship:7.1f} s   ({tasks} tasks; the median of "
            f"{len(ships)} ships by overhead)"
        )
        print(f"  of which calls to the box     : {round_trips(ship_out):7d}")
        print(
            f"  engine restart to ready       : {restart:7.1f} s   (the old server's stop, then {start:.1f})"
        )
        print(
            f"  overhead of the play          : {overhead:7.1f} s (goal <= 15 s; all "
            f"{', '.join(f'{s[0]:.1f}' for s in ships)} s)"
        )
        print(f"  of which the gate's smoke test: {smoke_seconds(ship_out):7.1f} s")
    finally:
        subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)


if __name__ == "__main__":
    main()
