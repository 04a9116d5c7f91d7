"""An operator's JSONL file of chat requests, read and checked line by line (library/chat_workload.py).

Standard library only: the module imports it on the controller's Python, and the action
(action_plugins/chat_workload.py) loads it from this file into the controller's own worker.
"""

from __future__ import annotations

import hashlib
import json


class WorkloadError(Exception):
    """str() is the one-line reason."""


def distinct_requests(requests, max_tokens, temperature):
    """The requests without repeats, in first-seen order: bodies that are the same once the defaults
    (max_tokens, temperature) are filled in are one request."""
    seen, distinct = set(), []
    for request in requests:
        body = json.dumps(
            {"max_tokens": max_tokens, "temperature": temperature, **request},
            sort_keys=True,
            separators=(",", ":"),
        )
        if body not in seen:
            seen.add(body)
            distinct.append(request)
    return distinct


def check_request(request, max_tokens, max_model_len, greedy_only=False):
    """One line on what is wrong with a parsed line, or None."""
    if not isinstance(request, dict):
        return f"is a JSON {type(request).__name__}, not an object (a chat request)"
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "has no messages (a non-empty list of chat messages)"
    if not all(isinstance(message, dict) and isinstance(message.get("role"), str) for message in messages):
        return "has a message that is not an object with a role"
    tokens = request.get("max_tokens", max_tokens)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        return f"has max_tokens {tokens!r}, not a whole number of at least 1"
    temperature = request.get("temperature", 0)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature < 0:
        return f"has temperature {temperature!r}, not a number of at least 0"
    if greedy_only and temperature > 0:
        return (
            f"samples (temperature {temperature}): vLLM's CPU build ends its engine on a sampled request "
            "when it speculates; send temperature 0"
        )
    if max_model_len and tokens >= max_model_len:
        return (
            f"asks for max_tokens {tokens}, but the server's context is {max_model_len} tokens "
            "(prompt and completion together)"
        )
    return None


def read_workload(text, path, max_tokens=64, max_model_len=0, greedy_only=False):
    """The requests of a JSONL text; raises WorkloadError naming the first bad line."""
    requests = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            raise WorkloadError(
                f"{path} line {number} is not JSON ({exc}): a JSONL file has one request a line"
            ) from None
        problem = check_request(request, max_tokens, max_model_len, greedy_only)
        if problem:
            raise WorkloadError(f"{path} line {number} {problem}")
        requests.append(request)
    if not requests:
        raise WorkloadError(f"{path} holds no request (one JSON chat request a line)")
    return requests


def describe(path, max_tokens=64, max_model_len=0, greedy_only=False, min_distinct=0):
    """The module's result for the file at `path`; raises WorkloadError with the one-line reason."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise WorkloadError(f"cannot read the workload file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(
            f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): not a JSONL file"
        ) from None
    requests = read_workload(text, path, max_tokens, max_model_len, greedy_only)
    distinct = len(distinct_requests(requests, max_tokens, 0))
    if distinct < min_distinct:
        raise WorkloadError(
            f"{path} holds {distinct} distinct requests in {len(requests)}: the measurement needs at "
            f"least {min_distinct} (identical requests count once, at temperature 0 a "
            "repeat repeats its outcome)"
        )
    return {
        "changed": False,
        "requests": requests,
        "count": len(requests),
        "distinct": distinct,
        "sha256": hashlib.sha256(raw).hexdigest(),
    }
