"""Model loads per workflow, counted on the sim box (prints figures beside the fewest possible; not a test).

A load is the expensive thing on a real box (a 550 GB checkpoint on 8 PCIe GPUs takes many minutes), and
the sim hides it. This bench runs each workflow as an operator would, with a real fleet's gate settings -
a speedup floor (gate_min_speedup 0.01: the baseline's tasks run end to end and pass on a CPU box, whose
speedup verdict is not the point) - and counts the engine starts in the box's journal since the workflow
began: every `Started vllm.service` and `Started vllm-trial.service` of systemd's, the serving unit's and
the trial unit's (roles/spec_tune, roles/nccl_tune, the gate's baseline) - and the seconds the box timed
for them (roles/vllm_service's loads.json: from each start to its first completion, or to its failure).
Two boxes of its own from the installed image
(vLLM installed, nothing served): specfleet-bench-loads (SSH 127.0.0.1:22126, server 18004) for the
workflows in turn, specfleet-bench-loads-2 (22127, 18005) for a first deploy whose drafter fails. Removes
them after.

    PYTHONPATH=bench .venv/bin/python -u bench/model_loads.py [--only 'first deploy,model_weights']
"""

import argparse
import datetime
import json
import subprocess
import sys
import time

from sim_bench import BIN, ROOT, box_vars, playbook

MODELS = ROOT / "build/sim-models"
BOXES = {"specfleet-bench-loads": (22126, 18004), "specfleet-bench-loads-2": (22127, 18005)}
# A real fleet's gate: a speedup floor (the roles' default is 1.2), low enough for a CPU box to pass; the
# drafters shipped after the first are under its best record, which is not what is counted here.
FLEET_GATE = ["-e", "gate_min_speedup=0.01", "-e", "gate_max_regression=0"]
IMAGE = ["-e", "sim_box_image=localhost/specfleet-simbox:installed"]


def drafter(name):
    return ["-e", f"eagle3_drafter_source={MODELS / name}"]


# (workflow, box, playbook, arguments, whether the run must pass, the fewest loads possible, note)
WORKFLOWS = [
    ("first deploy of a box", 0, "deploy.yml", [], True, 2, "the baseline, then the serving start"),
    ("a no-change run", 0, "deploy.yml", [], True, 0, ""),
    (
        "--tags eagle3, a new drafter",
        0,
        "playbooks/ship_drafter.yml",
        drafter("eagle3-known-3.0"),
        True,
        1,
        "",
    ),
    (
        "a due baseline alone",
        0,
        "deploy.yml",
        [*drafter("eagle3-known-3.0"), "-e", "gate_remeasure_baseline=true"],
        True,
        2,
        "what a vLLM upgrade adds to its own start (one vLLM release in the wheelhouse: no upgrade here)",
    ),
    (
        "a failed change, restored",
        0,
        "playbooks/ship_drafter.yml",
        drafter("eagle3-known-1.4"),
        False,
        2,
        "the change's start, then the restore's",
    ),
    (
        "tune_speculation.yml, k = 0..2",
        0,
        "playbooks/tune_speculation.yml",
        [*drafter("eagle3-known-3.0"), "-e", "spec_tune_take_out_of_service=true"],
        True,
        3,
        "K + 1: k = 0 is the gate's baseline, measured on its trial at the first deploy",
    ),
    (
        "tune_nccl.yml",
        0,
        "playbooks/tune_nccl.yml",
        [*drafter("eagle3-known-3.0"), "-e", "nccl_tune_stop_service=true"],
        True,
        1,
        "one load per change; and the baseline where the environment moved (its key has it)",
    ),
    (
        "--tags model_weights, new weights",
        0,
        "playbooks/ship_weights.yml",
        [
            *drafter("eagle3-known-3.0"),
            "-e",
            f"model_weights_source={MODELS / 'tokenmap'}",
            # A link the release serves through (the sim's target lies at its path as a directory).
            "-e",
            "vllm_service_model_path=/srv/models/tokenmap-shipped",
        ],
        True,
        2,
        "one load per change, plus the baseline: its key has the weights release",
    ),
    (
        "first deploy whose drafter fails",
        1,
        "deploy.yml",
        drafter("eagle3-known-1.4"),
        False,
        3,
        "the baseline (its key is new), the serving start, the fallback's",
    ),
]


def starts(container, since):
    """Engine starts (serving and trial units) in the box's journal since `since` (epoch seconds)."""
    out = subprocess.run(
        [
            "podman",
            "exec",
            container,
            "journalctl",
            "_PID=1",
            "--unit",
            "vllm.service",
            "--unit",
            "vllm-trial.service",
            "--since",
            f"@{int(since)}",
            "--output",
            "cat",
            "--no-pager",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [line for line in out.splitlines() if line.startswith("Started vllm")]
    return sum("vllm.service" in line for line in lines), sum("vllm-trial.service" in line for line in lines)


def timed(container, since):
    """(timed starts, their seconds) the box kept since `since` (epoch seconds)."""
    out = subprocess.run(
        ["podman", "exec", container, "cat", "/var/lib/specfleet/loads/loads.json"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    loads = json.loads(out)["loads"] if out else []
    recent = [
        load
        for load in loads
        if datetime.datetime.fromisoformat(load["started_at"]).timestamp() >= int(since) - 1
        and load["seconds"] is not None
    ]
    return len(recent), sum(load["seconds"] for load in recent)


def run(box, name, args, must_pass):
    """ansible-playbook against a box; a run expected to fail may (its restore is what is counted)."""
    port, http = BOXES[box]
    command = [str(BIN / "ansible-playbook"), name, *box_vars(box, port, http)]
    result = subprocess.run([*command, *IMAGE, *FLEET_GATE, *args], cwd=ROOT, capture_output=True, text=True)
    if must_pass and result.returncode != 0:
        sys.exit(f"{name} {' '.join(args)} failed:\n{result.stdout[-3000:]}")
    if not must_pass and result.returncode == 0:
        sys.exit(f"{name} {' '.join(args)} passed where it should fail:\n{result.stdout[-2000:]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="comma-separated: only the workflows whose name holds one")
    args = parser.parse_args()
    wanted = [part for part in args.only.split(",") if part] or [""]
    workflows = [workflow for workflow in WORKFLOWS if any(part in workflow[0] for part in wanted)]
    names = list(BOXES)
    for box in names:
        subprocess.run(["podman", "rm", "-f", box], capture_output=True, check=False)
    rows = []
    try:
        for box in names:
            port, http = BOXES[box]
            playbook(box_vars(box, port, http), "sim/start.yml", *IMAGE)
        for workflow, index, name, arguments, must_pass, fewest, note in workflows:
            box = names[index]
            time.sleep(1.1)  # the journal is read from a whole second on: none of the last workflow's
            began = time.time()
            started = time.monotonic()
            run(box, name, arguments, must_pass)
            serving, trial = starts(box, began)
            count, seconds = timed(box, began)
            rows.append((workflow, serving, trial, fewest, count, seconds, time.monotonic() - started, note))
            print(
                f"{workflow}: {serving + trial} load(s) ({serving} serving, {trial} trial), fewest {fewest};"
                f" {count} timed, {seconds:.0f} s"
            )
    finally:
        for box in names:
            subprocess.run(["podman", "rm", "-f", box], capture_output=True, check=False)
    header = f"{'workflow':<36} {'loads':>5} {'serving':>7} {'trial':>5} {'fewest':>6}      {'timed':>5}"
    print(f"\n{header} {'load s':>6} {'minutes':>7}  note")
    for workflow, serving, trial, fewest, count, load_seconds, seconds, note in rows:
        mark = "" if serving + trial <= fewest else " over"
        loads = f"{serving + trial:>5} {serving:>7} {trial:>5} {fewest:>6}{mark:<5}"
        print(f"{workflow:<36} {loads} {count:>5} {load_seconds:>6.0f} {seconds / 60:>7.1f}  {note}")


if __name__ == "__main__":
    main()
