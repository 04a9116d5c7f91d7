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


MODELS = ROOT / "build/sim-models"


def theory(drafter):
    """What sim/build_models.py computed for the token-map target and this known-acceptance drafter."""
    return json.loads((MODELS / drafter / "sim-theory.json").read_text())


def gated(drafter):
    """The figures the sim profile's gate measures in its first round (its workload file, sim-workload.jsonl:
    requests that each start their own walk), with each request's [drafts, accepted, draft tokens]."""
    workload = theory(drafter)["sim_workload"]
    return {**workload["expected"], "per_request": workload["per_request"][: workload["first_round"]]}


def one_chat(drafter, max_tokens):
    """(drafts, accepted tokens) of one chat completion of max_tokens at temperature 0: every chat prompt
    starts the same walk, whose verification steps the theory lists; the prefill gives the first token,
    each step its accepted drafts plus one, and the step that reaches max_tokens still counts in full."""
    output, drafts, accepted = 1, 0, 0
    for step in theory(drafter)["per_request"]["accepted_per_step"]:
        if output >= max_tokens:
            break
        drafts, accepted, output = drafts + 1, accepted + step, output + step + 1
    return drafts, accepted
