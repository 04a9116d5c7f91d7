"""Known-acceptance sim pairs on the real engine, and how often a gate reaches the right verdict
(prints figures; not a test).

Starts its own sim box from the installed image (container specfleet-bench-known, SSH on 127.0.0.1:22123,
the server on 127.0.0.1:18002), serving the token-map target. For each eagle3-known-* drafter
(sim/build_models.py, KNOWN ACCEPTANCE) it ships the drafter with `deploy.yml --tags eagle3` and prints,
beside the theory in the drafter's sim-theory.json:
  - the gate's figures (roles/gate's smoke test through speculation_gate, from its JSON report), with their
    confidence intervals;
  - vLLM's own `vllm bench serve` figures for the same server (run inside the box);
  - per-request counts for chat requests that start the token walk at every one of the cycle's tokens
    (an assistant message continued: the walk starts at its last token), against the theory per token.
The same requests are sent again at concurrency 4, each response carrying its own counts (the box serves
with --per-request-spec-decode-metrics summary, as a gate above concurrency 1 needs). Then, for every pair
and both concurrencies, it draws many workloads of 32 distinct requests from the measured ones and counts
how often the gate (module_utils/spec_stats.py's interval over requests; 8 more requests while it straddles
the default floor 2.20, up to 32; still straddling: fail) reaches the right verdict, the truth being the
pair's mean over all the cycle's start tokens, against the goals: at least 99% right for a pair 0.03 or
more from the floor, 95% nearer, at most 32 requests. At temperature 0 the engine is deterministic, so a
redrawn workload's counts are the measured counts of its requests (at concurrency 4, those measured under
concurrency): the draws reuse them instead of asking the server again. Removes the box after.

    .venv/bin/python bench/known_acceptance.py [--draws N]
"""

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ansible.module_utils
import yaml
from sim_bench import box_vars
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
# As ansible.cfg and tests/conftest.py do: ansible.module_utils.<name> also comes from module_utils/.
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))

from ansible.module_utils import prometheus_text, spec_stats, vllm_api  # noqa: E402

BIN = Path(sys.executable).parent
BOX = "specfleet-bench-known"
SSH_PORT, HTTP_PORT = 22123, 18002
BASE = f"http://127.0.0.1:{HTTP_PORT}"
MODELS = ROOT / "build/sim-models"
PAIRS = ["eagle3-known-1.4", "eagle3-known-2.18", "eagle3-known-2.2", "eagle3-known-3.0", "eagle3-known-3.4"]
FLOOR = 2.2  # roles/served/defaults: gate_min_mean_acceptance_length
# The decision goals (issue 41): share of right verdicts by distance from the floor, and the budget.
NEAR, GOAL_NEAR, GOAL_FAR, BUDGET, FIRST_ROUND = 0.03, 0.95, 0.99, 32, 8
CONCURRENCIES = (1, 4)
GROUP_VARS = (ROOT / "inventory/local/group_vars/sim_boxes.yml").read_text()
API_KEY = re.search(r"^vllm_service_api_key: (\S+)$", GROUP_VARS, re.M).group(1)
EXTRA = {
    "sim_box_image": "localhost/specfleet-simbox:installed",
    "sim_box_models": ["tokenmap"],
    "vllm_service_model_path": "/srv/models/tokenmap",
    # The gate measures and reports; the floors are this script's business.
    "gate_min_mean_acceptance_length": 0,
    "gate_min_acceptance_rate": 0,
    "gate_max_regression": 0,
    # Each response carries its own counts: what the draws at concurrency 4 are made of.
    "vllm_service_extra_args": [
        *yaml.safe_load(GROUP_VARS)["vllm_service_extra_args"],
        "--per-request-spec-decode-metrics",
        "summary",
    ],
}


def playbook(name, *args, **extra):
    started = time.monotonic()
    command = [
        str(BIN / "ansible-playbook"),
        name,
        *box_vars(BOX, SSH_PORT, HTTP_PORT),
        "-e",
        json.dumps({**EXTRA, **extra}),
        *args,
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{name} {' '.join(args)} failed:\n{result.stdout[-4000:]}")
    return time.monotonic() - started


def in_box(*command):
    return subprocess.run(
        ["podman", "exec", BOX, *command], capture_output=True, text=True, check=True
    ).stdout


def bench_serve(num_prompts=8, max_tokens=64):
    """vLLM's own benchmark client inside the box; its Speculative Decoding section as a dict."""
    out = in_box(
        "/opt/vllm/current/bin/vllm", "bench", "serve", "--backend", "openai-chat", "--base-url", "http://127.0.0.1:8000",
        "--endpoint", "/v1/chat/completions", "--model", "tiny", "--tokenizer", "/srv/models/tokenmap",
        "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", str(max_tokens),
        "--num-prompts", str(num_prompts), "--max-concurrency", "1", "--temperature", "0", "--ignore-eos",
        "--header", f"Authorization=Bearer {API_KEY}",
    )  # fmt: skip
    figures = {}
    for key, pattern in {
        "acceptance_rate": r"Acceptance rate \(%\):\s+([\d.]+)",
        "mean_acceptance_length": r"Acceptance length:\s+([\d.]+)",
        "num_drafts": r"Drafts:\s+(\d+)",
        "num_draft_tokens": r"Draft tokens:\s+(\d+)",
        "num_accepted_tokens": r"Accepted tokens:\s+(\d+)",
    }.items():
        match = re.search(pattern, out)
        figures[key] = float(match.group(1)) if match else None
    positions = re.findall(r"Position (\d+):\s+([\d.]+)", out)
    figures["per_position_acceptance"] = [float(value) / 100 for _, value in positions]
    if figures["acceptance_rate"] is not None:
        figures["acceptance_rate"] /= 100
    return figures, out


def continued_chat(token_text):
    """A chat request whose prompt ends with token_text: the assistant message is continued."""
    return {
        "messages": [{"role": "user", "content": "Go on."}, {"role": "assistant", "content": token_text}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": 64,
        "temperature": 0,
    }


def per_request(requests):
    """(drafts, accepted, accepted per position) of each request, sent one at a time, from /metrics
    before and after each (as the smoke module reads them at concurrency 1)."""

    def totals():
        _status, text = vllm_api.get_text(BASE + "/metrics", api_key=API_KEY, timeout=30)
        samples = prometheus_text.parse(text).samples

        def total(counter, **labels):
            name = f"vllm:spec_decode_num_{counter}_total"
            return sum(
                s.value
                for s in samples
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
            )

        return (
            total("drafts"),
            total("accepted_tokens"),
            [total("accepted_tokens_per_pos", position=str(i)) for i in range(3)],
        )

    counts = []
    before = totals()
    for request in requests:
        body = {**request, "model": "tiny", "stream": False}
        vllm_api.post_json(BASE + "/v1/chat/completions", body, api_key=API_KEY, timeout=120)
        after = totals()
        positions = [int(a - b) for a, b in zip(after[2], before[2])]
        counts.append((int(after[0] - before[0]), int(after[1] - before[1]), positions))
        before = after
    return counts


def concurrent_requests(requests, concurrency=4):
    """(drafts, accepted) of each request, sent `concurrency` at a time, from its response's own counts."""

    def one(request):
        body = {**request, "model": "tiny", "stream": False}
        _status, answer = vllm_api.post_json(
            BASE + "/v1/chat/completions", body, api_key=API_KEY, timeout=300
        )
        figures = answer["metrics"]["speculative_decoding"]
        return figures["num_spec_steps"], figures["num_accepted_draft_tokens"]

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, requests))


def mean_length(counts):
    return 1 + sum(c[1] for c in counts) / sum(c[0] for c in counts)


def gate(draw, confidence=0.95):
    """The smoke module's rule on a sequence of per-request (drafts, accepted) (module_utils/spec_stats, as
    library/speculation_gate.py calls it): rounds of FIRST_ROUND requests while the interval straddles the
    floor, up to BUDGET; still straddling, or no interval: fail. (passed, requests sent)."""
    z = spec_stats.z_score(confidence)
    sent = FIRST_ROUND
    while True:
        low_high = spec_stats.ratio_interval(draw[:sent], z)
        verdict = spec_stats.verdict((1 + low_high[0], 1 + low_high[1]), FLOOR) if low_high else "straddles"
        if verdict != "straddles" or sent >= BUDGET:
            return verdict == "above", sent
        sent += FIRST_ROUND


def decisions(counts, truth, draws, rng):
    """(share of right verdicts, mean requests sent) over `draws` workloads of BUDGET distinct requests."""
    right = sent_total = 0
    for _ in range(draws):
        passed, sent = gate(rng.sample(counts, BUDGET))
        right += passed == (truth >= FLOOR)
        sent_total += sent
    return right / draws, sent_total / draws


def table_row(*cells):
    widths = (18, 13, 7, 24, 7, 12, 18)
    return " ".join(f"{cell!s:<{width}}" for cell, width in zip(cells, widths)).rstrip()


def figures_row(name, source, figures, interval=None):
    per_pos = " / ".join(f"{p:.3f}" for p in figures.get("per_position_acceptance") or [])
    low_high = interval["mean_acceptance_length"] if interval else None
    return table_row(
        name,
        source,
        figures.get("num_drafts"),
        per_pos,
        f"{figures.get('acceptance_rate') or 0:.3f}",
        f"{figures.get('mean_acceptance_length') or 0:.3f}",
        f"[{low_high[0]:.3f}, {low_high[1]:.3f}]" if low_high else "",
    )


def measure_pair(name, theory, reports, starts, cycle):
    """Print the pair's rows; return its per-request counts over the cycle's start tokens."""
    report = json.loads((reports / "sim-gpu-box.json").read_text())["metrics"]
    bench, raw = bench_serve()
    print(figures_row(name, "theory", theory["sim_workload"]["expected"]))
    print(figures_row(name, "gate (smoke)", report, report.get("intervals")))
    print(figures_row(name, "vllm bench", bench))
    if bench["num_drafts"] is None:
        print("vllm bench serve printed no Speculative Decoding section:\n" + raw[-1500:])
    counts = per_request(starts)
    concurrent = concurrent_requests(starts)
    by_token = theory["any_prompt"]["mean_acceptance_length_by_last_cycle_token"]
    agree = sum(abs((1 + c[1] / c[0]) - by_token[str(token)]) < 1e-9 for c, token in zip(counts, cycle))
    print(
        f"{name:<18} per request: {agree}/{len(cycle)} start tokens give the theory's mean acceptance length "
        f"exactly; over all {len(cycle)}: {mean_length(counts):.4f}; at concurrency 4, "
        f"{sum(c[:2] == tuple(d) for c, d in zip(counts, concurrent))}/{len(cycle)} requests count the same"
    )
    return {1: [c[:2] for c in counts], 4: concurrent}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=2000)
    args = parser.parse_args()
    subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)
    reports = Path(tempfile.mkdtemp(prefix="specfleet-known-"))
    theory_of = {name: json.loads((MODELS / name / "sim-theory.json").read_text()) for name in PAIRS}
    cycle = theory_of[PAIRS[0]]["cycle_token_ids"]
    tokenizer = Tokenizer.from_file(str(MODELS / "tokenmap" / "tokenizer.json"))
    starts = [continued_chat(tokenizer.decode([token])) for token in cycle]
    measured = {}
    try:
        playbook("sim/start.yml")
        for index, name in enumerate(PAIRS):
            tags = ["--tags", "eagle3"] if index else []
            seconds = playbook(
                "deploy.yml", *tags, eagle3_drafter_source=str(MODELS / name), gate_report_dir=str(reports)
            )
            if not index:
                print(f"first deploy (tokenmap + {name}): {seconds:.0f} s\n")
                print(
                    table_row(
                        "pair",
                        "source",
                        "drafts",
                        "per-position acceptance",
                        "rate",
                        "mean length",
                        "95 % interval",
                    )
                )
            measured[name] = measure_pair(name, theory_of[name], reports, starts, cycle)
    finally:
        subprocess.run(["podman", "rm", "-f", BOX], capture_output=True, check=False)

    rng = random.Random(13)
    print(
        f"\nverdicts against the floor {FLOOR}, {args.draws} redrawn workloads of {BUDGET} distinct requests "
        f"each (rounds of {FIRST_ROUND}); goals: >= {GOAL_FAR:.0%} right {NEAR} or more from the floor, "
        f">= {GOAL_NEAR:.0%} nearer, <= {BUDGET} requests"
    )
    columns = ("pair", "true mean", "truth", "concurrency", "right", "goal", "requests")
    print(
        f"{columns[0]:<18} "
        + " ".join(f"{name:>{width}}" for name, width in zip(columns[1:], (9, 6, 11, 7, 5, 9)))
    )
    for name, by_concurrency in measured.items():
        for concurrency in CONCURRENCIES:
            counts = by_concurrency[concurrency]
            truth = mean_length(counts)
            share, sent = decisions(counts, truth, args.draws, rng)
            goal = GOAL_NEAR if abs(truth - FLOOR) < NEAR else GOAL_FAR
            verdict = "pass" if truth >= FLOOR else "fail"
            met = "met" if share >= goal and sent <= BUDGET else "MISSED"
            cells = f"{name:<18} {truth:>9.4f} {verdict:>6} {concurrency:>11} {share:>7.1%} {goal:>5.0%}"
            print(f"{cells} {sent:>9.1f}  {met}")


if __name__ == "__main__":
    main()
