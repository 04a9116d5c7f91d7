"""What capturing the box's own traffic costs a client (prints figures beside the goal; not a test).

roles/vllm_proxy's site in Debian's nginx (tests/nginx_proxy.py) in front of a stand-in upstream that answers
at once, so that the proxy's own time is all there is to see: chat completions with a 1 KB body, sent one at a
time, through the site without capture and through the same site with vllm_proxy_capture at 100% (every
request's body read whole and logged), in alternating rounds. The goal: no difference beyond the noise of one
run, the noise being how far the two halves of the runs without capture lie apart.

    .venv/bin/python bench/capture_latency.py [--requests 2000]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from nginx_proxy import Nginx, Upstream, free_port, render, request  # noqa: E402 (the tests' harness)

KEY = "bench-" + "k" * 58
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 1000}], "max_tokens": 16}


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def timed(port, count):
    """Milliseconds of each of `count` completions through the proxy on `port`."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        status, _ = request(port, "POST", "/v1/chat/completions", KEY, body=BODY)
        times.append((time.perf_counter() - started) * 1000)
        assert status == 200, status
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per configuration (default 2000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Upstream() as upstream:
        tmp = Path(tmp)
        ports = {"without": free_port(), "with": free_port()}
        (tmp / "capture").mkdir(mode=0o700)
        common = {"vllm_service_backend_port": upstream.port, "vllm_service_api_key": KEY}
        sites = render(
            tmp,
            {
                "without": {**common, "vllm_service_port": ports["without"]},
                "with": {
                    **common,
                    "vllm_service_port": ports["with"],
                    "vllm_proxy_capture": True,
                    "vllm_proxy_capture_percent": 100,
                    "vllm_proxy_capture_dir": str(tmp / "capture"),
                },
            },
        )
        servers = {}
        for name, site in sites.items():
            (tmp / name).mkdir()
            servers[name] = Nginx(tmp / name).start(site, ports[name])
        try:
            for name in servers:
                timed(ports[name], 50)  # warm both
            rounds, per_round = 10, max(1, args.requests // 10)
            times = {"without": [[], []], "with": [[], []]}
            for number in range(rounds):
                for name in ("without", "with") if number % 2 == 0 else ("with", "without"):
                    times[name][number * 2 // rounds].extend(timed(ports[name], per_round))
        finally:
            for server in servers.values():
                server.stop()
        kept = sum(1 for _ in (tmp / "capture" / "incoming.log").open())
    figures = {}
    for name, halves in times.items():
        every = halves[0] + halves[1]
        figures[name] = (statistics.median(every), percentile(every, 0.99))
        print(
            f"{name:>7} capture: p50 {figures[name][0]:.3f} ms, p99 {figures[name][1]:.3f} ms "
            f"({len(every)} completions)"
        )
    noise = [
        abs(statistics.median(times["without"][0]) - statistics.median(times["without"][1])),
        abs(percentile(times["without"][0], 0.99) - percentile(times["without"][1], 0.99)),
    ]
    for label, index in (("p50", 0), ("p99", 1)):
        difference = figures["with"][index] - figures["without"][index]
        verdict = "within" if abs(difference) <= noise[index] else "beyond"
        print(
            f"{label}: capture adds {difference:+.3f} ms; the noise of this run (its two halves without "
            f"capture) is {noise[index]:.3f} ms: {verdict} it (goal: within)"
        )
    print(f"requests kept by the capture: {kept}")


if __name__ == "__main__":
    main()
