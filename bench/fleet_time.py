"""Fleet-time model: what a rollout costs per box, and the projected time for 100 and 1,000 boxes
(prints figures; not a test).

Starts BOXES sim boxes (default 6; SPECFLEET_FLEET_BOXES) from the installed box image, each reached
over SSH on a loopback port of its own, and times deploy.yml runs against them:
  - the path up to the server (rollout's reach check, the checks, the driver, vLLM's install, the
    patch, lock and last known good; `--tags cuda,vllm,vllm_eagle3_patch`) with nothing to change:
    one box alone, every box one at a time (serial 1), every box in one batch (serial = BOXES,
    forks = BOXES), and a canary first batch (serial [1, "50%"]);
  - `--tags eagle3` (a drafter switch, the server's restart, the gate) on the first two boxes, which
    then serve vLLM: one at a time, then both in one batch.
From those runs, a linear model: a run's fixed cost F (parsing, the monitoring and summary plays),
a box's cost s when alone in its batch, and m, what each further box adds to a batch run in parallel.
On this 2-core machine every box's own work shares the controller's CPU, so m is an upper bound of
what a fleet of real boxes adds; the projection is also made with m = the controller's own CPU seconds
per box (ansible-playbook and what it waits for) spread over a controller of 8 cores, the boxes' work
being done on the boxes. The canary run is also predicted by the model, beside its measure.

    .venv/bin/python bench/fleet_time.py
"""

import json
import math
import os
import resource
import subprocess

import yaml
from sim_bench import CACHE, CONTROLLER_ACTIONS, ROOT, playbook

BOXES = int(os.environ.get("SPECFLEET_FLEET_BOXES", "6"))
NAMES = [f"fleet-{n:02d}" for n in range(1, BOXES + 1)]
SERVING = NAMES[:2]
CONTAINER = "specfleet-bench-fleet-{:02d}"
UP_TO_THE_SERVER = ["--tags", "cuda,vllm,vllm_eagle3_patch"]
# Actions that run on the controller alone (tasks are written with FQCNs: ansible-lint's production profile).
DRAFTERS = ROOT / "build/sim-models"
CONTROLLER_CORES = 8
SSH_USER = yaml.safe_load((ROOT / "sim/roles/sim_box/defaults/main.yml").read_text())["sim_box_ssh_user"]


def inventory():
    """-i arguments: the embedded default's group vars, and the bench's boxes in a group of their own."""
    hosts = {
        name: {
            "sim_box_container": CONTAINER.format(n),
            "ansible_port": 22140 + n,
            "sim_box_host_port": 18040 + n,
        }
        for n, name in enumerate(NAMES, 1)
    }
    reach = {"ansible_host": "127.0.0.1", "ansible_user": SSH_USER}
    fleet = {"hosts": hosts, "vars": {**reach, "sim_box_image": "localhost/specfleet-simbox:installed"}}
    path = CACHE / "bench" / "fleet.inventory.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tree = {"gpu_boxes": {"children": {"sim_boxes": {"children": {"bench_fleet": fleet}}}}}
    path.write_text(json.dumps({"all": {"children": tree}}))
    return ["-i", str(ROOT / "inventory/local"), "-i", str(path)]


def rollout(box, hosts, serial, forks, *args):
    """(seconds, recap, controller CPU seconds) of one deploy.yml run over these hosts with this serial
    and forks; the CPU is ansible-playbook's and what it waits for (its forks, its ssh clients)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds, recap, _ = playbook(
        box,
        "deploy.yml",
        "--limit",
        ",".join(hosts),
        "--forks",
        str(forks),
        "-e",
        json.dumps({"specfleet_serial": serial}),
        *args,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, recap, cpu


def remote_tasks(box, host):
    """Tasks of a no-change run that reached the box (not skipped, not a controller-only action): with
    pipelining, one SSH exchange each over the box's multiplexed connection."""
    env = {"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"}
    _, _, output = playbook(box, "deploy.yml", "--limit", host, *UP_TO_THE_SERVER, env=env)
    # The callback's one document, among profile_tasks' lines.
    run, _ = json.JSONDecoder().raw_decode(output[output.index("\n{") + 1 :])
    reached = [
        result.get("action", "")
        for play in run["plays"]
        for task in play["tasks"]
        for name, result in task["hosts"].items()
        if name == host and not result.get("skipped") and result.get("action") not in CONTROLLER_ACTIONS
    ]
    return len(reached), sum(1 for play in run["plays"] for task in play["tasks"] if host in task["hosts"])


def batches(boxes, serial):
    """Batch sizes as Ansible makes them from a serial list (the last value repeats; "P%" of all boxes)."""
    sizes, left = [], boxes
    steps = serial if isinstance(serial, list) else [serial]
    while left:
        step = steps[min(len(sizes), len(steps) - 1)]
        size = max(1, int(boxes * int(step[:-1]) / 100)) if isinstance(step, str) else int(step)
        sizes.append(min(size, left))
        left -= sizes[-1]
    return sizes


def model_time(fixed, alone, more, boxes, serial, forks):
    """F, then each batch: rounds of `forks` boxes, a round's first box at s, the others at m."""
    total = fixed
    for size in batches(boxes, serial):
        rounds = math.ceil(size / forks)
        total += rounds * alone + (size - rounds) * more
    return total


def fit(one, sequential, parallel, boxes):
    """(F, s, m) from one box alone, `boxes` boxes one at a time, and `boxes` boxes in one batch."""
    alone = (sequential - one) / (boxes - 1)
    fixed = one - alone
    more = (parallel - one) / (boxes - 1)
    return fixed, alone, more


def duration(seconds):
    return f"{seconds / 3600:5.1f} h" if seconds >= 3600 else f"{seconds / 60:5.1f} min"


def projections(label, fixed, alone, more, cpu):
    """The projected rollout times, with m as measured here (every box's work on these 2 cores) and with m
    = the controller's CPU per box spread over a controller of its own (the boxes' work on the boxes)."""
    own = cpu / CONTROLLER_CORES
    print(f"{label}: F = {fixed:.1f} s per run, s = {alone:.1f} s a box alone, m = {more:.1f} s a box more;")
    print(f"  controller CPU per box {cpu:.1f} s: m = {own:.2f} s on {CONTROLLER_CORES} cores of its own")
    settings = [(1, 1), ([1, "10%"], 10), ([1, "10%"], 50), ([1, "10%"], 100)]
    head = f"{CONTROLLER_CORES}-core controller"
    print(f"  {'serial':<12} {'forks':>5} | {'here: 100':>10} {'1,000':>9} | {head}: {'100':>9} {'1,000':>9}")
    for serial, forks in settings:
        here = [duration(model_time(fixed, alone, more, n, serial, forks)) for n in (100, 1000)]
        apart = [duration(model_time(fixed, alone, own, n, serial, forks)) for n in (100, 1000)]
        print(
            f"  {json.dumps(serial):<12} {forks:>5} | {here[0]:>10} {here[1]:>9} | {' ' * len(head)}  "
            f"{apart[0]:>9} {apart[1]:>9}"
        )


def main():
    box = inventory()
    containers = [CONTAINER.format(n) for n in range(1, BOXES + 1)]
    subprocess.run(["podman", "rm", "-f", *containers], capture_output=True, check=False)
    try:
        playbook(box, "sim/start.yml", "--limit", "bench_fleet", "--forks", str(BOXES))
        converge, recap, _ = rollout(box, NAMES, BOXES, BOXES, *UP_TO_THE_SERVER)
        print(f"{BOXES} boxes (installed image), up to the server converged: {converge:.1f} s ({recap})")
        one, recap, one_cpu = rollout(box, NAMES[:1], 1, 1, *UP_TO_THE_SERVER)
        print(f"no change, 1 box                        : {one:6.1f} s  ({recap})")
        reached, tasks = remote_tasks(box, NAMES[0])
        print(f"  of its {tasks} task results, {reached} reached the box (one SSH exchange each, pipelined)")
        sequential, recap, _ = rollout(box, NAMES, 1, 5, *UP_TO_THE_SERVER)
        print(f"no change, {BOXES} boxes, serial 1, forks 5   : {sequential:6.1f} s  ({recap})")
        parallel, recap, parallel_cpu = rollout(box, NAMES, BOXES, BOXES, *UP_TO_THE_SERVER)
        print(f"no change, {BOXES} boxes, serial {BOXES}, forks {BOXES}   : {parallel:6.1f} s  ({recap})")
        canary_serial = [1, "50%"]
        canary, recap, _ = rollout(box, NAMES, canary_serial, BOXES, *UP_TO_THE_SERVER)
        fixed, alone, more = fit(one, sequential, parallel, BOXES)
        predicted = model_time(fixed, alone, more, BOXES, canary_serial, BOXES)
        print(
            f'no change, {BOXES} boxes, serial [1, "50%"]   : {canary:6.1f} s  ({recap}); '
            f"the model says {predicted:.1f} s (batches {batches(BOXES, canary_serial)})"
        )
        cpu = (parallel_cpu - one_cpu) / (BOXES - 1)
        projections("the path up to the server, no change", fixed, alone, more, cpu)

        served, recap, _ = rollout(box, SERVING, 2, 2)
        print(f"\n{', '.join(SERVING)}: a whole deploy.yml, both serving: {served:.1f} s ({recap})")
        ship = ["--tags", "eagle3", "-e", "gate_max_regression=0"]
        new = ["-e", f"eagle3_drafter_source={DRAFTERS / 'eagle3-known-3.0'}"]
        one_by_one, recap, _ = rollout(box, SERVING, 1, 2, *ship, *new)
        print(f"--tags eagle3, a new drafter, 2 boxes, serial 1   : {one_by_one:6.1f} s  ({recap})")
        back = ["-e", f"eagle3_drafter_source={DRAFTERS / 'eagle3-known-3.4'}"]
        together, recap, together_cpu = rollout(box, SERVING, 2, 2, *ship, *back)
        print(f"--tags eagle3, back to the first, 2 boxes, serial 2: {together:6.1f} s  ({recap})")
        # The run's fixed cost is the no-change path's: the same plays around the same per-box tasks.
        alone_e = (one_by_one - fixed) / 2
        more_e = together - fixed - alone_e
        # The run's fixed CPU is the no-change path's too (a box alone, less that box's share).
        cpu_e = (together_cpu - (one_cpu - cpu)) / 2
        projections("--tags eagle3 (switch, restart, gate)", fixed, alone_e, more_e, cpu_e)
    finally:
        subprocess.run(["podman", "rm", "-f", *containers], capture_output=True, check=False)


if __name__ == "__main__":
    main()
