"""The converged simulated box: unit, NCCL environment, service, and a real EAGLE-3 server."""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "library"))
import gpu_topology  # noqa: E402

FIXTURE = ROOT / "tests/fixtures/nvidia-smi/rtx4090-8gpu-pcie"
GROUP_VARS = ROOT / "inventory/local/group_vars/sim_boxes.yml"
API_KEY = re.search(r"^vllm_service_api_key: (\S+)$", GROUP_VARS.read_text(), re.M).group(1)
BASE = "http://127.0.0.1:8000"


def http(host, path, payload=None, api_key=API_KEY):
    """GET or POST (JSON) from inside the box; returns (status, body text)."""
    script = (
        "import json,sys,urllib.request,urllib.error\n"
        "data=sys.argv[2].encode() if sys.argv[2] else None\n"
        "req=urllib.request.Request(sys.argv[1],data=data,headers={'Content-Type':'application/json',"
        "'Authorization':'Bearer '+sys.argv[3]})\n"
        "try:\n r=urllib.request.urlopen(req,timeout=120); print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n print(e.code); print(e.read().decode())\n"
    )
    out = host.check_output(
        "python3 -c %s %s %s %s",
        script,
        BASE + path,
        json.dumps(payload) if payload else "",
        api_key,
    )
    status, _, body = out.partition("\n")
    return int(status), body


def unit_environment(host):
    line = host.check_output("systemctl show vllm --property=Environment --value")
    return dict(item.split("=", 1) for item in line.split())


def test_unit_nccl_environment_matches_the_topology(host):
    expected = gpu_topology.recommend_nccl_env(
        gpu_topology.parse_topo_matrix((FIXTURE / "topo-m.txt").read_text())
    )
    assert expected, "an 8-GPU PCIe box must get a tuned NCCL environment"
    env = unit_environment(host)
    nccl = {k: v for k, v in env.items() if k.startswith(("NCCL_", "CUDA_DEVICE_MAX"))}
    assert nccl == expected


def test_unit_is_valid_and_keeps_the_api_key_out(host):
    unit = host.file("/etc/systemd/system/vllm.service")
    assert unit.mode == 0o644
    assert API_KEY not in unit.content_string
    assert "EnvironmentFile=-/etc/vllm/vllm.env" in unit.content_string
    assert "--speculative-config" in unit.content_string
    host.run_test("systemd-analyze verify /etc/systemd/system/vllm.service")
    env_file = host.file("/etc/vllm/vllm.env")
    assert (env_file.user, env_file.group, env_file.mode) == ("root", "root", 0o600)
    assert env_file.content_string == f"VLLM_API_KEY={API_KEY}\n"


def test_service_runs_enabled_as_the_service_user(host):
    service = host.service("vllm")
    assert service.is_running
    assert service.is_enabled
    pid = host.check_output("systemctl show vllm --property=MainPID --value")
    assert host.check_output("ps -o user= -p %s", pid) == "vllm"
    assert host.user("vllm").shell == "/usr/sbin/nologin"


def test_health_answers(host):
    assert http(host, "/health")[0] == 200


def test_api_key_is_enforced(host):
    assert http(host, "/v1/models", api_key="wrong-key")[0] == 401
    assert http(host, "/v1/models")[0] == 200


@pytest.fixture(scope="module")
def drafts_before(host):
    return spec_counter(host, "vllm:spec_decode_num_drafts_total")


def spec_counter(host, name):
    status, body = http(host, "/metrics")
    assert status == 200
    values = [float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name + "{")]
    return sum(values)


def test_completion_is_speculated(host, drafts_before):
    status, body = http(
        host,
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 32,
            "temperature": 0,
        },
    )
    assert status == 200, body
    text = json.loads(body)["choices"][0]["message"]["content"]
    assert text.strip()
    assert spec_counter(host, "vllm:spec_decode_num_drafts_total") > drafts_before
