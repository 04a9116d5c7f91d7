"""Print where the deployed server listens and one chat answer from it.

Reads the host's inventory variables (JSON, from `ansible-inventory --host`) on stdin.
"""

import json
import sys
import urllib.request

hostvars = json.load(sys.stdin)
port = hostvars.get("vllm_service_port", 8000)
# The first of the keys the proxy accepts (the new one while keys rotate).
key = (hostvars.get("vllm_service_api_keys") or [hostvars.get("vllm_service_api_key", "")])[0]
url = f"http://127.0.0.1:{port}"
request = urllib.request.Request(
    f"{url}/v1/chat/completions",
    data=json.dumps(
        {
            "model": hostvars["vllm_service_served_model_name"],
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 24,
            "temperature": 0,
        }
    ).encode(),
    headers={
        "Content-Type": "application/json",
        "Authorization": f"Bearer {key}",
    },
)
with urllib.request.urlopen(request, timeout=120) as response:
    answer = json.load(response)["choices"][0]["message"]["content"]
print(f"vLLM listens on {url} (OpenAI API; key in the inventory)")
print(f"answer: {answer!r}")
