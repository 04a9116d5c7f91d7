"""Prometheus's own promtool over the fleet's exported rules (roles/monitoring): vLLM's counters as a box
exports them, and `promtool test rules` (tests/unit/test_monitoring_rules.py, the example scenario)."""

import shutil
import subprocess
from pathlib import Path

import yaml
from driver import BIN

PROMTOOL = shutil.which("promtool", path=str(BIN)) or shutil.which("promtool")
# Minutes of every input series.
MINUTES = 40


def counters(box, drafts, k, accepted_per_pos, generation, model="kimi"):
    """Cumulative counters growing by these amounts every minute (promtool's `0+NxM` series)."""
    labels = f'job="specfleet-vllm", host="{box}", model_name="{model}", engine="0"'
    grow = f"0+{{}}x{MINUTES}"
    series = [{"series": f"vllm:generation_tokens_total{{{labels}}}", "values": grow.format(generation)}]
    if drafts:
        series += [
            {"series": f"vllm:spec_decode_num_drafts_total{{{labels}}}", "values": grow.format(drafts)},
            {
                "series": f"vllm:spec_decode_num_draft_tokens_total{{{labels}}}",
                "values": grow.format(drafts * k),
            },
            {
                "series": f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}}",
                "values": grow.format(sum(accepted_per_pos)),
            },
        ]
        series += [
            {
                "series": f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels}, position="{i}"}}',
                "values": grow.format(accepted),
            }
            for i, accepted in enumerate(accepted_per_pos)
        ]
    return series


def alert(box, severity="warning", **labels):
    return {"exp_labels": {"severity": severity, "host": box, **labels}}


def without_annotations(rules: Path, out: Path) -> Path:
    """The rules with their annotations stripped: promtool compares annotations too, and the alert
    labels are what this test is about (test_an_alert_says_the_floor_it_missed reads one annotation)."""
    groups = yaml.safe_load(rules.read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    out.write_text(yaml.safe_dump(groups))
    return out


def promtool_test(tmp_path, rules: Path, tests: list) -> subprocess.CompletedProcess:
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}))
    return subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, check=False)
