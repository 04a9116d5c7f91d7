"""After side_effect: the passing release (known acceptance 3.4) serves and passes; the 15% one and the
regressing 3.0 one stayed as releases (nothing deleted); the baseline is kept on the box; the controller
holds the host's report; the last known good is what passed, root-only."""

import json
from pathlib import Path

from sim_box_client import chat, counter, gated, one_chat

ROOT = Path(__file__).resolve().parents[3]

DRAFTERS = "/srv/drafters"


def source_of(host, link):
    target = host.file(f"{DRAFTERS}/{link}").linked_to
    return json.loads(host.file(f"{target}/.release.json").content_string)["source"]


def test_passing_release_serves_with_its_known_acceptance(host):
    assert source_of(host, "current").endswith("/build/sim-models/eagle3-known-3.4")
    drafted = counter(host, "vllm:spec_decode_num_draft_tokens_total")
    accepted = counter(host, "vllm:spec_decode_num_accepted_tokens_total")
    assert chat(host, max_tokens=32).strip()
    drafts, accepted_tokens = one_chat("eagle3-known-3.4", 32)
    assert counter(host, "vllm:spec_decode_num_draft_tokens_total") - drafted == 3 * drafts
    assert counter(host, "vllm:spec_decode_num_accepted_tokens_total") - accepted == accepted_tokens


def test_rejected_release_was_kept(host):
    sources = [
        json.loads(host.file(f"{DRAFTERS}/releases/{name}/.release.json").content_string)["source"]
        for name in host.check_output(f"ls {DRAFTERS}/releases").split()
    ]
    kept = ["eagle3-known-1.4", "eagle3-known-3.0", "eagle3-known-3.4"]
    assert sorted(Path(s).name for s in sources) == kept


def test_baseline_is_kept_with_date_and_workload(host):
    baseline = json.loads(host.file("/var/lib/specfleet/baseline.json").content_string)
    assert baseline["tokens_per_second"] > 0
    assert baseline["measured_at"].startswith("20")
    assert baseline["workload"]["model"] == "tiny"
    # Over the gate's whole budget, round by round, so that a verdict after any round compares the same
    # requests; kept for what it ran on.
    assert len(baseline["per_round"]) == 32 // 8 and all(
        tokens > 0 and s > 0 for tokens, s in baseline["per_round"]
    )
    assert (
        baseline["workload"]["gpus"] == ["GeForce RTX 4090"] and baseline["workload"]["driver"] == "575.57.08"
    )
    assert baseline["workload"]["tensor_parallel_size"] == 1 and baseline["workload"]["nccl_environment"]
    assert baseline["workload"]["weights"] == "/srv/models/tokenmap"


def test_controller_report_says_the_last_gate_passed(host):
    report = json.loads((ROOT / "reports" / f"{host.backend.name}.json").read_text())
    assert report["passed"] is True
    expected = gated("eagle3-known-3.4")
    for figure in ("num_drafts", "num_accepted_tokens_per_pos", "acceptance_rate", "mean_acceptance_length"):
        assert report["metrics"][figure] == expected[figure], figure
    # The sim profile's requests each start their own walk on the token map: each request's counts as the
    # theory gives them, and an interval of real width around the figure.
    assert report["metrics"]["per_request"] == expected["per_request"]
    assert report["metrics"]["intervals"]["method"] == "per request"
    low, high = report["metrics"]["intervals"]["mean_acceptance_length"]
    assert 2.2 < low < expected["mean_acceptance_length"] < high, (low, high)
    assert report["workload"]["digest"] == report["metrics"]["workload_digest"]
    assert report["metrics"]["errors"] == 0


def test_last_known_good_is_what_passed_root_only(host):
    kept = "/var/lib/specfleet/last_good"
    for path, mode in ((kept, 0o700), (f"{kept}/record.json", 0o600), (f"{kept}/files/unit", 0o600)):
        assert (host.file(path).user, host.file(path).mode) == ("root", mode), path
    record = json.loads(host.file(f"{kept}/record.json").content_string)
    assert record["links"]["drafter"] == host.file(f"{DRAFTERS}/current").linked_to
    release = host.file("/opt/vllm/current").linked_to
    assert record["links"]["vllm"] == release == record["details"]["vllm_venv"]
    assert host.file(f"{kept}/files/unit").content == host.file("/etc/systemd/system/vllm.service").content
    expected = gated("eagle3-known-3.4")
    assert record["details"]["gate"]["mean_acceptance_length"] == expected["mean_acceptance_length"]
    assert record["details"]["vllm_venv"] in host.file(f"{kept}/files/unit").content_string
    assert record["details"]["vllm_version"] and record["recorded_at"].startswith("20")
