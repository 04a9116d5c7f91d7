"""The speculation tuner on the sim box (prints figures; not a test).

Starts its own sim box from the installed image (container specfleet-bench-tune, SSH on 127.0.0.1:22125,
the server on 127.0.0.1:18003), serving the token-map target. For a middle and a high known-acceptance
drafter (sim/build_models.py: eagle3-known-2.2 and eagle3-known-3.4) it deploys the drafter, then runs
`deploy.yml --tags spec_tune -e spec_tune_measure=true` as an operator would (taking the box out of service)
and prints, from the table the tuner kept on the box:
  - tokens/s and inter-token latency per k x concurrency, each k's gain over speculation off with its interval
    over the rounds, the k chosen per concurrency and the schedule;
  - the concurrency from which speculation stops paying on this machine;
  - the mean acceptance length per k predicted from the per-position acceptance at the largest k, beside
    the one measured at that k;
  - the tuner's cost: server starts and minutes, and projected for a model that takes 10 minutes to load.
Removes the box after.

    .venv/bin/python bench/spec_tune_table.py [--max-concurrency 8] [--rounds 2]
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from sim_bench import box_vars

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BOX = "specfleet-bench-tune"
SSH_PORT, HTTP_PORT = 22125, 18003
MODELS = ROOT / "build/sim-models"
PAIRS = ["eagle3-known-2.2", "eagle3-known-3.4"]
KEPT = "/var/lib/specfleet/spec_tune.json"
LOAD_MINUTES = 10  # the projection: a large model's load time per server start


def playbook(name, *args, **extra):
    base = {
        "sim_box_image": "localhost/specfleet-simbox:installed",
        "sim_box_models": ["tokenmap"],
    }
    started = time.monotonic()
    command = [
        str(BIN / "ansible-playbook"),
        name,
        *box_vars(BOX, SSH_PORT, HTTP_PORT),
        "-e",
        json.dumps({**base, **extra}),
        *args,
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{name} {' '.join(args)} failed:\n{result.stdout[-4000:]}")
    return time.monotonic() - started


def kept():
    out = subprocess.run(["podman", "exec", BOX, "cat", KEPT], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def start_seconds(since):
    """Seconds of each trial server's start since `since` (epoch seconds), from the journal: unit started ->
    vLLM's API server up."""
    out = subprocess.run(
        [
            "podman",
            "exec",
            BOX,
            "journalctl",
            "--unit",
            "vllm-trial",
            "--output",
            "short-unix",
            "--no-pager",
            "--since",
            f"@{int(since)}",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    starts, seconds = None, []
    for line in out.splitlines():
        stamp = float(line.split()[0])
        if "Started vllm-trial.service" in line:  # systemd's line, not uvicorn's "Started server process"
            starts = stamp
        elif starts is not None and 'GET /health HTTP/1.1" 200' in line:
            seconds.append(stamp - starts)
            starts = None
    return seconds


def print_table(table):
    rows = table["rows"]
    ks = sorted({row["k"] for row in rows})
    per_concurrency = table["choice"]["per_concurrency"]
    header = " ".join(f"{'k=' + str(k) + ' tok/s':>11} {'ITL ms':>7}" for k in ks)
    print(f"{'concurrency':>11} {header}  chosen")
    for concurrency in sorted({row["concurrency"] for row in rows}):
        cells = {row["k"]: row for row in rows if row["concurrency"] == concurrency}
        line = " ".join(
            f"{cells[k]['tokens_per_second']:>11.1f} {cells[k]['inter_token_latency_ms'] or 0:>7.2f}"
            for k in ks
        )
        chosen = per_concurrency[str(concurrency)]
        print(f"{concurrency:>11} {line}  k={chosen['k']} ({chosen['gain']:.2f}x)")
    print("each k's gain over speculation off, round against round, with its interval:")
    for concurrency in sorted({row["concurrency"] for row in rows}):
        gains = per_concurrency[str(concurrency)]["gains"]
        shown = ", ".join(
            f"k={k} {gain:.2f}x " + (f"[{low:.2f}, {high:.2f}]" if high is not None else "(one round)")
            for k, (gain, low, high) in sorted(gains.items(), key=lambda item: int(item[0]))
        )
        print(f"{concurrency:>11} {shown}")


def crossover(table):
    """The lowest concurrency measured from which no k pays any more."""
    chosen = {int(c): value["k"] for c, value in table["choice"]["per_concurrency"].items()}
    paying = [c for c, k in chosen.items() if k > 0]
    if not paying:
        return "speculation pays at no concurrency measured"
    later = [c for c in sorted(chosen) if c > max(paying)]
    if later:
        return f"from concurrency {later[0]}"
    return f"it still pays at {max(chosen)}, the highest measured"


def print_predictions(rows):
    at_one = {row["k"]: row for row in rows if row["concurrency"] == 1}
    largest = max(at_one)
    curve = at_one[largest]["per_position_acceptance"]
    print(f"mean acceptance length at concurrency 1, predicted from k={largest}'s per-position acceptance")
    for k in range(1, largest + 1):
        predicted = 1 + sum(curve[:k])
        measured = at_one[k]["mean_acceptance_length"]
        print(f"  k={k}: predicted {predicted:.3f}, measured {measured:.3f} ({measured - predicted:+.3f})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)
    tune = {
        "spec_tune_measure": True,
        "spec_tune_take_out_of_service": True,
        # The drafters' own k (the sim profile measures only up to 2 to keep the suite short).
        "spec_tune_max_k": 3,
        "spec_tune_max_concurrency": args.max_concurrency,
        "spec_tune_rounds": args.rounds,
    }
    try:
        playbook("sim/start.yml")
        for index, name in enumerate(PAIRS):
            source = {"eagle3_drafter_source": str(MODELS / name)}
            seconds = playbook("deploy.yml", *(["--tags", "eagle3"] if index else []), **source)
            print(f"\n== {name}: deployed in {seconds:.0f} s")
            tuned_from = time.time()
            seconds = playbook("deploy.yml", "--tags", "spec_tune", **source, **tune)
            table = kept()
            print_table(table)
            print(f"schedule: {table['choice']['reason']}")
            print(f"speculation stops paying: {crossover(table)}")
            print_predictions(table["rows"])
            starts = start_seconds(tuned_from)
            measuring = table["cost"]["seconds"]
            loading = sum(starts)
            starts_count = table["cost"]["server_starts"]
            # Every trial start and the serving unit's start after, each a full model load.
            projected = (measuring - loading) / 60 + (starts_count + 1) * LOAD_MINUTES
            print(
                f"cost: {starts_count} server starts, {measuring / 60:.1f} min measuring"
                f" (of which {loading / 60:.1f} min loading the model), {seconds / 60:.1f} min the whole run;"
                f" with a {LOAD_MINUTES}-minute model load: about"
                f" {projected:.0f} min (the trial starts and the serving unit's)"
            )
    finally:
        subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)


if __name__ == "__main__":
    main()
