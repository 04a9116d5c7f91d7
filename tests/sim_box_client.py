"""Talk to the vLLM server inside a simulated box from testinfra tests (through the box's own Python)."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUP_VARS = ROOT / "inventory/local/group_vars/sim_boxes.yml"
API_KEY = re.search(r"^vllm_service_api_key: (\S+)$", GROUP_VARS.read_text(), re.M).group(1)
BASE = "http://127.0.0.1:8000"

_SCRIPT = (
    "import json,sys,urllib.request,urllib.error\n"
    "data=sys.argv[2].encode() if sys.argv[2] else None\n"
    "req=urllib.request.Request(sys.argv[1],data=data,headers={'Content-Type':'application/json',"
    "'Authorization':'Bearer '+sys.argv[3]})\n"
    "try:\n r=urllib.request.urlopen(req,timeout=120); print(r.status); print(r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n print(e.code); print(e.read().decode())\n"
)


def http(host, path, payload=None, api_key=API_KEY):
    """GET, or POST JSON when payload is given; returns (status, body text)."""
    out = host.check_output(
        "python3 -c %s %s %s %s", _SCRIPT, BASE + path, json.dumps(payload) if payload else "", api_key
    )
    status, _, body = out.partition("\n")
    return int(status), body


def chat(host, content="Hello", max_tokens=32):
    status, body = http(
        host,
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
    )
    assert status == 200, body
    return json.loads(body)["choices"][0]["message"]["content"]


def counter(host, name):
    """Sum of a Prometheus counter over all label sets on /metrics."""
    status, body = http(host, "/metrics")
    assert status == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name + "{"))
