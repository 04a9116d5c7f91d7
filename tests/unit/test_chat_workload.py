"""library/chat_workload.py: an operator's JSONL file of chat requests, read and checked line by line."""

import hashlib
import json

import chat_workload
import pytest
from driver import run_playbook

REQUESTS = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Why is the sky blue?"},
        ]
    },
    {
        "messages": [{"role": "user", "content": "Write a haiku."}],
        "max_tokens": 48,
        "temperature": 0.7,
        "top_p": 0.9,
    },
]


def write(tmp_path, lines):
    path = tmp_path / "traffic.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reads_every_request_in_order_with_the_file_digest(tmp_path, run_module):
    path = write(tmp_path, [json.dumps(r) for r in REQUESTS[:1]] + [""] + [json.dumps(REQUESTS[1])])
    result = run_module(chat_workload, {"path": str(path)})
    assert result.get("failed") is not True, result
    assert (result["changed"], result["count"], result["requests"]) == (False, 2, REQUESTS)
    assert result["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("lines", "args", "problem"),
    [
        (["{not json"], {}, "line 1 is not JSON (Expecting property name enclosed in double quotes: line 1"),
        ([json.dumps(REQUESTS[0]), "[1, 2]"], {}, "line 2 is a JSON list, not an object (a chat request)"),
        (['{"prompt": "hi"}'], {}, "line 1 has no messages (a non-empty list of chat messages)"),
        (['{"messages": []}'], {}, "line 1 has no messages (a non-empty list of chat messages)"),
        (['{"messages": ["hi"]}'], {}, "line 1 has a message that is not an object with a role"),
        (
            ['{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}'],
            {},
            "line 1 has max_tokens 0, not a whole number of at least 1",
        ),
        (
            ['{"messages": [{"role": "user", "content": "x"}], "temperature": -1}'],
            {},
            "line 1 has temperature -1, not a number of at least 0",
        ),
        (
            [json.dumps(REQUESTS[1]), json.dumps({**REQUESTS[1], "max_tokens": 600})],
            {"max_model_len": 512},
            "line 2 asks for max_tokens 600, but the server's context is 512 tokens (prompt and completion",
        ),
        (
            [json.dumps(REQUESTS[0])],
            {"max_model_len": 512, "max_tokens": 512},
            "line 1 asks for max_tokens 512, but the server's context is 512 tokens",
        ),
        ([""], {}, "holds no request (one JSON chat request a line)"),
        # The request that ended the sim's CPU engine (docs/sim.md).
        (
            [
                json.dumps(REQUESTS[0]),
                json.dumps({**REQUESTS[1], "temperature": 1.0, "top_p": 0.5, "top_k": 3}),
            ],
            {"greedy_only": True},
            "line 2 samples (temperature 1.0): vLLM's CPU build ends its engine on a sampled request",
        ),
    ],
)
def test_bad_lines_are_refused_with_one_line(tmp_path, run_module, lines, args, problem):
    path = write(tmp_path, lines)
    result = run_module(chat_workload, {"path": str(path), **args})
    assert result["failed"] is True
    assert result["msg"].startswith(f"{path} {problem}"), result["msg"]
    assert "\n" not in result["msg"]


def test_a_sampled_request_is_read_for_a_gpu_server(tmp_path, run_module):
    path = write(tmp_path, [json.dumps({**REQUESTS[0], "temperature": 0.7})])
    result = run_module(chat_workload, {"path": str(path)})
    assert result["requests"][0]["temperature"] == 0.7


def test_a_file_that_is_not_text(tmp_path, run_module):
    path = tmp_path / "traffic.jsonl"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    result = run_module(chat_workload, {"path": str(path)})
    assert result["msg"].startswith(f"{path} is not UTF-8 text (invalid start byte at byte 0")


def test_a_missing_file(tmp_path, run_module):
    result = run_module(chat_workload, {"path": str(tmp_path / "nowhere.jsonl")})
    assert (
        result["msg"]
        == f"cannot read the workload file {tmp_path / 'nowhere.jsonl'}: No such file or directory"
    )


def read_on_the_controller(tmp_path, args):
    """chat_workload as preflight runs it on the controller (its action); the run and the task's result."""
    playbook = tmp_path / "read.yml"
    play = {
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": [{"chat_workload": args}],
    }
    playbook.write_text(json.dumps([play]))
    run = run_playbook(playbook, inventory="localhost,")
    return run, run.one(host="localhost", action="chat_workload")


def test_on_the_controller_it_runs_in_the_worker_as_the_module_would(tmp_path, run_module):
    path = write(tmp_path, [json.dumps(r) for r in REQUESTS] + [json.dumps(REQUESTS[0])])
    run, result = read_on_the_controller(tmp_path, {"path": str(path), "max_tokens": 48})
    assert run.ok, str(run)
    # No module ran: a module's result carries its invocation.
    module = run_module(chat_workload, {"path": str(path), "max_tokens": 48})
    assert "invocation" not in result.result and "invocation" in module
    fields = ("changed", "requests", "count", "distinct", "sha256")
    assert {k: result.result[k] for k in fields} == {k: module[k] for k in fields}
    assert (result.result["count"], result.result["distinct"]) == (3, 2)
    run, _ = read_on_the_controller(tmp_path, {"path": str(path), "min_distinct": 5})
    assert not run.ok and run.failures() == [
        f"{path} holds 2 distinct requests in 3: the measurement needs at least 5 (identical requests count "
        "once, at temperature 0 a repeat repeats its outcome)"
    ], str(run)
