#!/usr/bin/python3
"""Wait up to --wait seconds for a vLLM unit to answer /health, failing fast if it crashed; then, with
--model, ask it for one real completion (one call to the box for both).

Exit 0: /health answered 200 (and the completion came; its text is printed as JSON). Exit 3: still
loading (poll again), with the engine's latest load stage from the unit's journal (this start's lines).
Exit 1: the unit failed or systemd restarted it after a crash (waiting longer cannot help), or the
completion failed. The API key is read from the unit's own environment file
(--env-file), never from the command line. Runs with the box's Python.
"""

import argparse
import json
import re
import subprocess
import sys
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


def unit_state(unit):
    out = subprocess.run(
        ["systemctl", "show", unit, "--property=ActiveState,SubState,NRestarts"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


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
    """(exit code, what to print): one greedy completion of --prompt."""
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
    return 0, json.dumps({"completion": text})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--unit", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--wait", type=float, default=30)
    parser.add_argument("--model", help="ask the served model for one completion once healthy")
    parser.add_argument("--prompt", default="Hello")
    parser.add_argument("--env-file")
    parser.add_argument("--completion-timeout", type=float, default=300)
    args = parser.parse_args()
    health = f"{args.base_url}/health"

    deadline = time.monotonic() + args.wait
    while True:
        state = unit_state(args.unit)
        # NRestarts counts automatic restarts since the last explicit start: each one is a crash.
        if state.get("ActiveState") == "failed" or int(state.get("NRestarts", "0")) > 0:
            print(
                f"{args.unit} crashed ({state.get('ActiveState')}/{state.get('SubState')}, "
                f"{state.get('NRestarts')} automatic restarts)"
            )
            return 1
        if state.get("ActiveState") == "inactive":
            print(f"{args.unit} is not running")
            return 1
        if healthy(health):
            code, said = completion(args) if args.model else (0, f"{health} answered 200")
            print(said)
            return code
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
