"""Chat load for a vLLM server: the built-in prompts, the workload sent, and requests at a concurrency
(standard library only; used on the box by the smoke test and the speculation tuner).

Requests are chat completions at the given temperature (0 by default: greedy decoding, so a request's
tokens, and its speculative acceptance, are fixed); a workload is the list of request bodies in the
order sent, identified by workload_digest(). A request repeated at temperature 0 repeats its outcome:
identical bodies are one request (distinct_requests), and no measurement sends one twice (workload).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.vllm_api import HttpError, VllmApiError, excerpt, post_json, post_stream
from ansible.module_utils.workload_file import distinct_requests

__all__ = [
    "DEFAULT_PROMPTS",
    "chat_requests",
    "distinct_requests",
    "workload",
    "workload_digest",
    "chat_once",
    "draft_length_counts",
    "run_requests",
    "stream_once",
    "load_cell",
]

# Ordinary chat requests of different kinds; never random tokens (their degenerate loops inflate acceptance).
# Distinct, so that a gate that measures more (max_prompts) learns something from every one at temperature 0.
DEFAULT_PROMPTS = (
    "Explain what a hash table is and when you would use one, in three sentences.",
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "What causes the seasons on Earth? Answer for a curious twelve-year-old.",
    "Summarize the plot of Romeo and Juliet in one short paragraph.",
    "Give me five tips for writing clear git commit messages.",
    "Translate into French: 'The train to Lyon leaves at half past eight from platform four.'",
    "A shop sells pencils at 3 for 50 cents. How much do 18 pencils cost? Show your reasoning step by step.",
    "Write a haiku about autumn rain on a city street.",
    "Compare TCP and UDP in a short table with three rows.",
    "Draft a polite email asking a colleague to review a pull request by Friday.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "What is the difference between a process and a thread? Keep it under 100 words.",
    "Explain photosynthesis as a short list of steps.",
    "Suggest three names for a bakery that specialises in sourdough bread.",
    "Write a bash one-liner that counts the lines of every .py file under the current directory.",
    "Why does ice float on water?",
    "Give a short recipe for a vegetarian lentil soup.",
    "Explain the CAP theorem with one example for each trade-off.",
    "Rewrite this sentence in plain English: 'We will leverage synergies to operationalise our roadmap.'",
    "What were the main causes of the First World War? Answer in four bullet points.",
    "Write a JavaScript function that debounces another function.",
    "How do vaccines train the immune system? Explain simply.",
    "List the planets of the solar system with one fact about each.",
    "Write a limerick about a cat who learns to code.",
    "What does a load balancer do, and what are two common algorithms it uses?",
    "Convert 72 degrees Fahrenheit to Celsius and show the formula.",
    "Give me a packing list for a three-day hiking trip.",
    "Explain big-O notation with the examples of linear and binary search.",
    "Write a short motivational message for a team before a product launch.",
    "What is the difference between weather and climate?",
    "Describe how HTTPS protects a connection, step by step.",
    "Write a regular expression that matches an ISO 8601 date such as 2026-12-01, and explain it.",
)


def chat_requests(requests=None, prompts=None):
    """The workload as chat request bodies: `requests` as given, or one user message per prompt
    (the built-in prompts by default)."""
    if requests is not None:
        return [dict(request) for request in requests]
    return [{"messages": [{"role": "user", "content": prompt}]} for prompt in prompts or DEFAULT_PROMPTS]


def workload(items, count, start=0):
    """The workload items sent, in order: `count` of them (never more than there are, so none is sent
    twice) from position `start`, wrapping around the end."""
    return [items[i % len(items)] for i in range(start, start + min(count, len(items)))]


def workload_digest(requests, max_tokens, temperature):
    """sha256 of what is sent: each body with the module's defaults filled in, canonical JSON, in order."""
    bodies = [{"max_tokens": max_tokens, "temperature": temperature, **request} for request in requests]
    return hashlib.sha256(json.dumps(bodies, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def spec_decode_counts(body):
    """[drafts, accepted, draft tokens] of a response's own speculative-decoding figures (vLLM's
    --per-request-spec-decode-metrics, 0.32 on: metrics.speculative_decoding), or None without them."""
    metrics = body.get("metrics") if isinstance(body, dict) else None
    figures = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(figures, dict):
        return None
    counts = [figures.get(key) for key in ("num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens")]
    return counts if all(isinstance(n, int) and not isinstance(n, bool) for n in counts) else None


def draft_length_counts(body):
    """{draft length: [verify steps, accepted draft tokens]} of a response's per-step figures (vLLM's
    --per-request-spec-decode-metrics detailed, 0.32 on: per_step_drafted and per_step_accepted), or None
    without them. A k schedule drafts another length when the batch size moves."""
    metrics = body.get("metrics") if isinstance(body, dict) else None
    figures = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    drafted = figures.get("per_step_drafted") if isinstance(figures, dict) else None
    accepted = figures.get("per_step_accepted") if isinstance(figures, dict) else None
    if not isinstance(drafted, list) or not isinstance(accepted, list) or len(drafted) != len(accepted):
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in drafted + accepted):
        return None
    lengths = {}
    for length, taken in zip(drafted, accepted):
        entry = lengths.setdefault(length, [0, 0])
        entry[0] += 1
        entry[1] += taken
    return dict(sorted(lengths.items()))


def chat_once(url, api_key, model, request, max_tokens, temperature, timeout):
    """One chat completion of a request body; return (usage.completion_tokens, spec_decode_counts and
    draft_length_counts of the response). Raises VllmApiError."""
    payload = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        **request,
        "model": model,
        "stream": False,
    }
    status, body = post_json(url, payload, api_key=api_key, timeout=timeout)
    usage = body.get("usage") if isinstance(body, dict) else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        raise HttpError(
            f"POST {url} returned HTTP {status} without usage.completion_tokens: {excerpt(json.dumps(body))}",
            url,
            status,
        )
    return tokens, spec_decode_counts(body), draft_length_counts(body)


def run_requests(
    url, api_key, model, requests, max_tokens, temperature, concurrency, timeout, after_each=None
):
    """Send every request with `concurrency` threads; return (completion_tokens, elapsed_s, errors,
    counts, lengths).

    errors is a list of the VllmApiError of each failed request, in order; counts and lengths the
    spec_decode_counts and draft_length_counts of each request's response, in order (None where the
    response had none, or the request failed). At concurrency 1, after_each() (when given) is called after
    every request: the counters are read there.
    """

    def one(request):
        try:
            tokens, counts, lengths = chat_once(
                url, api_key, model, request, max_tokens, temperature, timeout
            )
            return tokens, counts, lengths, None
        except VllmApiError as exc:
            return 0, None, None, exc

    started = time.monotonic()
    if concurrency == 1:
        results = []
        for request in requests:
            results.append(one(request))
            if after_each:
                after_each()
    else:
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(requests)))) as pool:
            results = list(pool.map(one, requests))
    elapsed = time.monotonic() - started
    return (
        sum(result[0] for result in results),
        elapsed,
        [result[3] for result in results if result[3]],
        [result[1] for result in results],
        [result[2] for result in results],
    )


def stream_once(url, api_key, model, request, max_tokens, temperature, timeout):
    """One streamed chat completion: (completion_tokens, seconds to the first token, seconds from the
    first token to the last). Raises VllmApiError."""
    payload = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        **request,
        "model": model,
        "stream_options": {"include_usage": True},
    }
    started = time.monotonic()
    first = last = None
    tokens = None
    for at, event in post_stream(url, payload, api_key=api_key, timeout=timeout):
        choices = event.get("choices") if isinstance(event, dict) else None
        if choices and (choices[0].get("delta") or {}).get("content"):
            first = at if first is None else first
            last = at
        usage = event.get("usage") if isinstance(event, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            tokens = usage["completion_tokens"]
    if tokens is None or first is None:
        raise HttpError(f"POST {url} streamed no content with usage.completion_tokens", url, 200)
    return tokens, first - started, last - first


def load_cell(url, api_key, model, requests, max_tokens, concurrency, timeout, temperature=0.0):
    """The requests streamed `concurrency` at a time: output tokens per second over the whole cell,
    and the median inter-token latency (a request's first-to-last token time over its tokens after
    the first), with the errors. With speculation a chunk can carry several tokens: the latency is
    per token, not per chunk."""

    def one(request):
        try:
            return stream_once(url, api_key, model, request, max_tokens, temperature, timeout), None
        except VllmApiError as exc:
            return None, exc

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(requests)))) as pool:
        results = list(pool.map(one, requests))
    elapsed = time.monotonic() - started
    done = [result for result, _error in results if result]
    tokens = sum(count for count, _ttft, _span in done)
    latencies = [span / (count - 1) for count, _ttft, span in done if count > 1]
    return {
        "concurrency": concurrency,
        "requests": len(requests),
        "completion_tokens": tokens,
        "seconds": round(elapsed, 4),
        "tokens_per_second": round(tokens / elapsed, 2) if elapsed > 0 else 0.0,
        "inter_token_latency_ms": round(1000 * statistics.median(latencies), 3) if latencies else None,
        "errors": [str(error) for _result, error in results if error],
    }
