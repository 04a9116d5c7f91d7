"""After side_effect: the accepting release serves and passes; the random one stayed as a release
(nothing deleted); the baseline is kept on the box; the controller holds the host's report."""

import json
from pathlib import Path

from sim_box_client import chat, counter

ROOT = Path(__file__).resolve().parents[3]

DRAFTERS = "/srv/drafters"


def source_of(host, link):
    target = host.file(f"{DRAFTERS}/{link}").linked_to
    return json.loads(host.file(f"{target}/.release.json").content_string)["source"]


def test_accepting_release_serves_with_full_acceptance(host):
    assert source_of(host, "current").endswith("/build/sim-models/eagle3-accept")
    drafted = counter(host, "vllm:spec_decode_num_draft_tokens_total")
    accepted = counter(host, "vllm:spec_decode_num_accepted_tokens_total")
    assert chat(host).strip()
    new = counter(host, "vllm:spec_decode_num_draft_tokens_total") - drafted
    assert new > 0 and counter(host, "vllm:spec_decode_num_accepted_tokens_total") - accepted == new


def test_rejected_release_was_kept(host):
    sources = [
        json.loads(host.file(f"{DRAFTERS}/releases/{name}/.release.json").content_string)["source"]
        for name in host.check_output(f"ls {DRAFTERS}/releases").split()
    ]
    assert sorted(Path(s).name for s in sources) == ["eagle3-accept", "eagle3-random"]


def test_baseline_is_kept_with_date_and_workload(host):
    baseline = json.loads(host.file("/var/lib/specfleet/baseline.json").content_string)
    assert baseline["tokens_per_second"] > 0
    assert baseline["measured_at"].startswith("20")
    assert baseline["workload"]["model"] == "tiny"


def test_controller_report_says_the_last_gate_passed(host):
    report = json.loads((ROOT / "reports" / f"{host.backend.name}.json").read_text())
    assert report["passed"] is True
    assert report["metrics"]["acceptance_rate"] == 1.0
    assert report["metrics"]["mean_acceptance_length"] == 4.0
    assert report["metrics"]["per_position_acceptance"] == [1.0, 1.0, 1.0]
    assert report["metrics"]["errors"] == 0
