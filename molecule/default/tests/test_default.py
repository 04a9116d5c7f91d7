"""The converged simulated box: unit, NCCL environment, service, and a real EAGLE-3 server."""

import json
import re
from pathlib import Path

import gpu_topology
from sim_box_client import API_KEY, chat, counter, http

ROOT = Path(__file__).resolve().parents[3]
SITE = "/etc/nginx/conf.d/specfleet-vllm.conf"
FIXTURE = ROOT / "tests/fixtures/nvidia-smi/rtx4090-8gpu-pcie"


def unit_environment(host):
    """The environment the server process runs with, read as its own user (the container's root may not
    read another user's /proc/<pid>/environ)."""
    pid = host.check_output("systemctl show vllm --property=MainPID --value")
    lines = host.check_output("runuser -u vllm -- cat /proc/%s/environ | tr '\\0' '\\n'", pid).splitlines()
    return dict(line.split("=", 1) for line in lines)


def test_unit_nccl_environment_is_the_measured_winner(host):
    # The side effect measured with --tags nccl_tune (gloo on CPU processes, no GPU here).
    kept = json.loads(host.file("/var/lib/specfleet/nccl_tune.json").content_string)
    rule = gpu_topology.recommend_nccl_env(
        gpu_topology.parse_topo_matrix((FIXTURE / "topo-m.txt").read_text())
    )
    assert rule, "an 8-GPU PCIe box must get a tuned NCCL environment from the topology"
    candidates = {candidate["name"]: candidate for candidate in kept["choice"]["candidates"]}
    assert candidates["defaults"]["env"] == {}
    assert candidates["topology-rule-pcie"]["env"] == rule
    assert kept["identity"]["backend"] == "gloo"
    assert kept["identity"]["world_size"] == 8
    assert kept["identity"]["driver"] == "575.57.08"
    assert kept["identity"]["gpus"] == ["NVIDIA GeForce RTX 4090"]
    # The sim target's hidden size is 128: decode batches 1..64 and prefill chunks of 512..8192 tokens.
    assert kept["identity"]["sizes"] == [256, 2048, 8192, 16384, 131072, 524288, 2097152]
    env = unit_environment(host)
    nccl = {k: v for k, v in env.items() if k.startswith(("NCCL_", "CUDA_DEVICE_MAX"))}
    assert nccl == kept["choice"]["env"]


def test_environment_values_reach_the_server_as_written(host):
    assert unit_environment(host)["SPECFLEET_QUOTING"] == 'say "hi" \\ 50% $HOME; x'


def test_no_measurement_process_is_left_behind(host):
    assert "nccl_allreduce_bench" not in host.check_output("ps -eo args")


def test_unit_is_valid_and_keeps_the_api_key_out(host):
    unit = host.file("/etc/systemd/system/vllm.service")
    assert unit.mode == 0o644
    assert API_KEY not in unit.content_string
    assert "EnvironmentFile=-/etc/vllm/vllm.env" in unit.content_string
    assert "--speculative-config" in unit.content_string
    host.run_test("systemd-analyze verify /etc/systemd/system/vllm.service")
    # Behind the proxy vLLM holds no key (roles/served's served_backend_api_key): the clients' key is in the
    # proxy's root-only site alone, so changing it restarts nothing.
    assert not host.file("/etc/vllm/vllm.env").exists
    # There as a regular expression: each character but letters and digits in a class of its own.
    assert re.sub(r"([^A-Za-z0-9])", r"[\1]", API_KEY) in host.file(SITE).content_string
    # Nor is it in the box's log: a module logs its arguments there unless the task is no_log.
    assert API_KEY not in host.check_output("journalctl --no-pager --output=cat")


def test_service_runs_enabled_as_the_service_user(host):
    service = host.service("vllm")
    assert service.is_running
    assert service.is_enabled
    pid = host.check_output("systemctl show vllm --property=MainPID --value")
    assert host.check_output("ps -o user= -p %s", pid) == "vllm"
    assert host.user("vllm").shell == "/usr/sbin/nologin"


def test_vllm_listens_on_loopback_behind_the_proxy(host):
    """Clients reach nginx on 8000 (roles/vllm_proxy); vLLM itself only on the box (127.0.0.1:18000)."""
    listening = host.check_output("ss -Hltnp")
    assert "127.0.0.1:18000 " in listening and "0.0.0.0:18000" not in listening, listening
    assert [line for line in listening.splitlines() if "0.0.0.0:8000 " in line and "nginx" in line], listening
    site = host.file("/etc/nginx/conf.d/specfleet-vllm.conf")
    assert (site.mode, site.user, site.group) == (0o600, "root", "root")
    assert not host.file("/etc/nginx/sites-enabled/default").exists


def test_health_answers(host):
    assert http(host, "/health")[0] == 200


def test_api_key_is_enforced(host):
    assert http(host, "/v1/models", api_key="wrong-key")[0] == 401
    assert http(host, "/v1/models")[0] == 200


def test_completion_is_speculated(host):
    drafts_before = counter(host, "vllm:spec_decode_num_drafts_total")
    assert chat(host).strip()
    assert counter(host, "vllm:spec_decode_num_drafts_total") > drafts_before


def test_server_survives_a_request_for_logprobs(host):
    """Ordinary requests must not take the sim's engine down: logprobs runs a torch.compile'd kernel,
    which on this box (no C++ compiler) would kill the engine unless the sim profile turns dynamo off."""
    payload = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    status, body = http(host, "/v1/chat/completions", payload)
    assert status == 200, body
    assert len(json.loads(body)["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
    assert chat(host).strip()
    assert http(host, "/health")[0] == 200


def test_speculation_table_is_kept_with_its_identity(host):
    kept = json.loads(host.file("/var/lib/specfleet/spec_tune.json").content_string)
    assert kept["measured_at"].startswith("20")
    identity = kept["identity"]
    current = host.file("/srv/drafters/current").linked_to
    assert identity["drafter_release"] == current.rsplit("/", 1)[-1]
    assert identity["vllm_version"] == "0.32.0" and identity["driver"] == "575.57.08"
    assert len(identity["gpus"]) == 8 and len(identity["workload"]) == 64
    assert {row["k"] for row in kept["rows"]} == {0, 1, 2}
    assert not host.file("/run/systemd/system/vllm-trial.service").exists
