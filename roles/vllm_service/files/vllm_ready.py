#!/usr/bin/python3
"""Wait up to --wait seconds for a vLLM unit to answer /health, failing fast if it crashed; then, with
--model, ask it for one real completion (one call to the box for both).

Exit 0: /health answered 200 (and the completion came: its text, and the load timed below or null, are
printed as JSON). Exit 3: still
loading (poll again), with the engine's latest load stage from the unit's journal (this start's lines).
Exit 1: the unit failed or systemd restarted it after a crash (waiting longer cannot help), the start
took longer than --timeout, or the completion failed. The API key is read from the unit's own
environment file (--env-file), never from the command line. Runs with the box's Python.

With --loads-dir, every start this check sees loading is timed, from systemd's start of the unit's
process to its first real completion (or to its failure), and kept there in loads.json with what was
started (vLLM release, model and drafter as their links resolve, k), trial units' starts too; the latest
--keep are kept, and loads.prom has them in Prometheus's text format. A start already serving when first
seen (a restart nobody watched) has no time to give and is not kept. A crash is laid to the start seen
loading only where it is the unit's last explicit start (systemd's journal names it where systemd restarted
the unit since); one left loading by a run killed before is marked unfinished, and a crashed start never
seen loading is timed only from its own start.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# The engine's load stages as vLLM logs them: the checkpoint's shards, the weights and the drafter, and on
# the GPU builds torch.compile and CUDA graph capture, then the API server's start.
LOAD_STAGES = re.compile(
    r"Starting to load model|Loading safetensors checkpoint shards|Loading weights took|Loading drafter model"
    r"|Model loading took|torch\.compile takes|Compiling a graph|Capturing CUDA graphs?"
    r"|Graph capturing finished|init engine \(|Waiting for application startup"
)
# vLLM's own prefix, "(EngineCore pid=73) INFO 12-06 22:47:37 [default_loader.py:501] ", and a progress
# bar's timing, " [00:01<00:02, 1.2it/s]".
LOG_PREFIX = re.compile(r"^(\(\w+ pid=\d+\) )?(INFO|WARNING|DEBUG):? +(\d\d-\d\d [\d:.]+ \[[^\]]+\] )?")
BAR_TIMING = re.compile(r" \[[^\]]*(it/s|s/it|\?)[^\]]*\]$")


def load_progress(lines):
    """The latest load stage among the journal's lines of this start, as vLLM said it, or None."""
    for line in reversed(lines):
        if LOAD_STAGES.search(line):
            return BAR_TIMING.sub("", LOG_PREFIX.sub("", line.strip()))
    return None


def journal(unit):
    """The unit's journal lines of its current start (its invocation), the latest 500."""
    invocation = subprocess.run(
        ["systemctl", "show", unit, "--property=InvocationID", "--value"], capture_output=True, text=True
    ).stdout.strip()
    if not invocation:
        return []
    return subprocess.run(
        ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "--output=cat", "--no-pager", "--lines=500"],
        capture_output=True,
        text=True,
    ).stdout.splitlines()


UNIT_PROPERTIES = (
    "ActiveState,SubState,NRestarts,InvocationID,ExecStart,ExecMainStartTimestampMonotonic,"
    "ExecMainExitTimestampMonotonic"
)
# systemd's "Scheduled restart job, restart counter is at N." (SD_MESSAGE_UNIT_RESTART_SCHEDULED), logged with
# N_RESTARTS and the invocation of the start that crashed.
RESTART_SCHEDULED = "5eb03494b6584870a536b337290809b3"


def unit_state(unit):
    out = subprocess.run(
        ["systemctl", "show", unit, f"--property={UNIT_PROPERTIES}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def first_restarted(unit):
    """The invocation of the unit's last explicit start where systemd restarted the unit automatically since:
    the start whose crash made this boot's latest restart 1 (an explicit start sets the counter back);
    '' where the journal does not say. Its InactiveExitTimestamp cannot tell: an automatic restart passes
    through failed too, and moves it."""
    name = unit if unit.endswith(".service") else f"{unit}.service"
    try:
        out = subprocess.run(
            ["journalctl", "--boot", "--output=json", "--lines=1", "--no-pager"]
            + [f"MESSAGE_ID={RESTART_SCHEDULED}", f"UNIT={name}", "N_RESTARTS=1"],
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        return json.loads(out[-1]).get("INVOCATION_ID") or ""
    except (OSError, IndexError, ValueError, AttributeError):
        return ""


def healthy(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def api_key(env_file):
    """VLLM_API_KEY from the unit's environment file; none without the file (no key configured)."""
    try:
        with open(env_file, encoding="utf-8") as lines:
            for line in lines:
                name, _, value = line.strip().partition("=")
                if name == "VLLM_API_KEY":
                    return value
    except FileNotFoundError:
        pass
    return None


def completion(args):
    """(exit code, the completion's text or why it failed): one greedy completion of --prompt."""
    body = {"model": args.model, "prompt": args.prompt, "max_tokens": 8, "temperature": 0}
    headers = {"Content-Type": "application/json"}
    key = api_key(args.env_file) if args.env_file else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        f"{args.base_url}/v1/completions", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=args.completion_timeout) as response:
            text = json.load(response)["choices"][0]["text"]
    except urllib.error.HTTPError as error:
        return 1, f"POST /v1/completions answered {error.code} {error.reason}"
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as error:
        return 1, f"POST /v1/completions failed: {error}"
    return 0, text


def started_with(exec_start):
    """What the unit's ExecStart serves, as systemctl shows it ("{ path=… ; argv[]=… serve MODEL … ; … }"):
    the vLLM release (the virtualenv's name), the model and drafter as their links resolve now, and k
    (the largest of a schedule; 0 without speculation)."""
    match = re.search(r"argv\[\]=(\S+) serve (\S+)", exec_start)
    if not match:
        return {}
    what = {
        "vllm": os.path.basename(os.path.dirname(os.path.dirname(match.group(1)))),
        "model": os.path.realpath(match.group(2)),
        "drafter": None,
        "k": 0,
    }
    flag = exec_start.find("--speculative-config ")
    if flag >= 0:
        try:
            config, _ = json.JSONDecoder().raw_decode(exec_start, flag + len("--speculative-config "))
        except ValueError:
            return what
        if config.get("model"):
            what["drafter"] = os.path.realpath(config["model"])
        # vLLM's schedule: [first batch size, last batch size, k] per range.
        schedule = config.get("num_speculative_tokens_per_batch_size") or []
        what["k"] = max([config.get("num_speculative_tokens") or 0, *(entry[-1] for entry in schedule)])
    return what


def _boot_id():
    """This boot's id: monotonic times compare only within one boot."""
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
        return boot.read().strip()


def _monotonic_us(state, name):
    """A number systemd shows (a monotonic time, a count); 0 where it shows none."""
    value = state.get(name, "0")
    return int(value) if value.isdigit() else 0


class Loads:
    """The timed starts kept on the box (--loads), newest last, and their export (--metrics)."""

    def __init__(self, directory, keep, unit):
        self.path, self.metrics = os.path.join(directory, "loads.json"), os.path.join(directory, "loads.prom")
        self.keep, self.unit = keep, unit

    def read(self):
        try:
            with open(self.path, encoding="utf-8") as kept:
                return json.load(kept).get("loads", [])
        except (FileNotFoundError, ValueError):
            return []

    def observe(self, state, outcome, reason=None):
        """Keep this start's state (loading, served, failed); the load's entry, or None where nothing is
        kept (a start first seen serving, or one already settled)."""
        invocation = state.get("InvocationID") or ""
        started_us = _monotonic_us(state, "ExecMainStartTimestampMonotonic")
        boot = _boot_id()
        now_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        loads = self.read()
        entry = next((load for load in loads if invocation and load["invocation"] == invocation), None)
        stale = []
        if entry is None and outcome == "failed":
            # A start seen loading is an explicit one (the check fails once systemd restarted the unit), and
            # the crash is its own only where it is still the unit's last explicit start: the current one,
            # or, where systemd restarted the unit since (under new invocations), the one the journal names.
            # One left loading by a run killed while it watched was an earlier start's, which ended
            # unwatched: it is not blamed for this crash.
            last = first_restarted(self.unit) if _monotonic_us(state, "NRestarts") else invocation
            watched = [
                load
                for load in loads
                if last
                and load["unit"] == self.unit
                and load["outcome"] == "loading"
                and load.get("boot") == boot
            ]
            entry = next((load for load in watched if load["invocation"] == last), None)
            stale = [load for load in watched if load is not entry]
            for load in stale:
                load["outcome"] = "unfinished"
        if entry is None and (outcome == "served" or not invocation or not started_us):
            if stale:
                self.write(loads[-self.keep :])
            return None  # a start first seen serving, or no start to time
        if entry is not None and (entry["outcome"] != "loading" or outcome == "loading"):
            return None  # settled already, or seen loading before: nothing new
        if entry is None:
            for earlier in loads:
                if earlier["unit"] == self.unit and earlier["outcome"] == "loading":
                    earlier["outcome"] = "unfinished"  # the check that watched it ended with its play
            started = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(
                microseconds=now_us - started_us
            )
            entry = {
                "invocation": invocation,
                "unit": self.unit,
                "started_at": started.isoformat(timespec="seconds"),
                **started_with(state.get("ExecStart", "")),
                "outcome": "loading",
                "seconds": None,
                "reason": None,
                "boot": boot,
                "start_us": started_us,
            }
            loads.append(entry)
        if outcome != "loading":
            # A failed start ends at its process's exit where systemd saw one, else now.
            exited_us = _monotonic_us(state, "ExecMainExitTimestampMonotonic") if outcome == "failed" else 0
            ended_us = exited_us if exited_us > entry["start_us"] else now_us
            entry.update(
                outcome=outcome, seconds=round((ended_us - entry["start_us"]) / 1e6, 1), reason=reason
            )
        self.write(loads[-self.keep :])
        return entry

    def write(self, loads):
        _replace(self.path, json.dumps({"loads": loads}, indent=1) + "\n")
        _replace(self.metrics, prometheus_text(loads))


def _replace(path, text):
    """Written beside and renamed: a reader (nginx, Prometheus) never sees half a file. World-readable:
    nginx serves the metrics, and neither holds a secret. The mode of the directories made here (and of
    the file's own, which an earlier version may have left narrower) is set, not asked of makedirs: the
    umask narrows that (0750 under umask 027, and nginx's workers are refused)."""
    directory = os.path.dirname(path)
    made, parent = [directory], os.path.dirname(directory)  # its own, and each parent makedirs makes
    while parent and not os.path.isdir(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    os.makedirs(directory, exist_ok=True)
    for each in made:
        os.chmod(each, 0o755)
    handle, staged = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path))
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(staged, 0o644)
    os.replace(staged, path)


def _label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _gauge(name, description, samples):
    """One gauge's lines: samples as (labels, value)."""
    lines = [f"# HELP {name} {description}", f"# TYPE {name} gauge"]
    return lines + [f"{name}{{{labels}}} {value}" for labels, value in samples]


def prometheus_text(loads):
    """The last served load's seconds beside the box's best with the same vLLM and model (a slower load
    of the same thing: a lost compile cache, a slow disk, a degraded GPU), and the kept starts by outcome."""
    lines = []
    served = [load for load in loads if load["outcome"] == "served"]
    if served:
        last = served[-1]
        release = (last.get("vllm"), last.get("model"))
        best = min(load["seconds"] for load in served if (load.get("vllm"), load.get("model")) == release)
        labels = (
            f'vllm="{_label(last.get("vllm"))}",model="{_label(os.path.basename(last.get("model") or ""))}"'
        )
        started = datetime.datetime.fromisoformat(last["started_at"]).timestamp()
        lines += _gauge(
            "specfleet_vllm_last_load_seconds",
            "Seconds from the last timed start to its first real completion.",
            [(labels, last["seconds"])],
        )
        lines += _gauge(
            "specfleet_vllm_best_load_seconds",
            "The fastest kept load of the same vLLM and model.",
            [(labels, best)],
        )
        lines += _gauge(
            "specfleet_vllm_last_load_start_time_seconds",
            "When the last timed start began.",
            [(labels, f"{started:.0f}")],
        )
    outcomes = ("served", "failed", "unfinished", "loading")
    counts = [
        (f'outcome="{outcome}"', sum(load["outcome"] == outcome for load in loads)) for outcome in outcomes
    ]
    lines += _gauge("specfleet_vllm_kept_loads", "The starts kept on the box, by outcome.", counts)
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--unit", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--wait", type=float, default=30)
    parser.add_argument("--model", help="ask the served model for one completion once healthy")
    parser.add_argument("--prompt", default="Hello")
    parser.add_argument("--env-file")
    parser.add_argument("--completion-timeout", type=float, default=300)
    parser.add_argument(
        "--timeout", type=float, help="seconds a start may take to serve, from the unit's start"
    )
    parser.add_argument("--loads-dir", help="where the timed starts are kept (a trial unit's too)")
    parser.add_argument("--keep", type=int, default=100)
    args = parser.parse_args()
    health = f"{args.base_url}/health"
    loads = Loads(args.loads_dir, args.keep, args.unit) if args.loads_dir else None

    def keep(state, outcome, reason=None):
        """The load's entry, if kept: keeping it never fails the check (said on stderr instead)."""
        try:
            return loads.observe(state, outcome, reason) if loads else None
        except (OSError, ValueError, LookupError, TypeError, AttributeError) as error:
            print(f"the load was not kept: {error!r}", file=sys.stderr)
            return None

    def failed(state, reason):
        print(reason)
        keep(state, "failed", reason)
        return 1

    deadline = time.monotonic() + args.wait
    while True:
        state = unit_state(args.unit)
        # NRestarts counts automatic restarts since the last explicit start: each one is a crash.
        if state.get("ActiveState") == "failed" or int(state.get("NRestarts", "0")) > 0:
            return failed(
                state,
                f"{args.unit} crashed ({state.get('ActiveState')}/{state.get('SubState')}, "
                f"{state.get('NRestarts')} automatic restarts)",
            )
        if state.get("ActiveState") == "inactive":
            print(f"{args.unit} is not running")
            return 1
        if healthy(health):
            if not args.model:
                print(f"{health} answered 200")
                return 0
            code, said = completion(args)
            if code:
                return failed(state, said)
            print(json.dumps({"completion": said, "load": keep(state, "served")}))
            return 0
        started_us = _monotonic_us(state, "ExecMainStartTimestampMonotonic")
        running_s = (time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000 - started_us) / 1e6
        if args.timeout and started_us and running_s >= args.timeout:
            return failed(state, f"{args.unit} did not serve within {args.timeout:g} s of its start")
        keep(state, "loading")
        if time.monotonic() >= deadline:
            stage = load_progress(journal(args.unit))
            print(
                f"{args.unit} still loading ({state.get('ActiveState')}/{state.get('SubState')})"
                + (f": {stage}" if stage else "")
            )
            return 3
        time.sleep(0.25)


if __name__ == "__main__":
    sys.exit(main())
