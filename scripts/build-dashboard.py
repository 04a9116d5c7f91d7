#!/usr/bin/env python3
"""Build the speculation dashboard that roles/monitoring ships, with grafana-foundation-sdk builders.

Code rather than hand-edited JSON: every query is built from one selector and one rate helper, so a
renamed metric or label is one edit here. The JSON is committed because the role copies it as a file
(no SDK where Ansible runs it); --check exits 1 when the committed file is not what this code builds.
Usage: .venv/bin/python scripts/build-dashboard.py [--check]
"""

import argparse
import json
import pathlib
import sys

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    LegendDisplayMode,
    LegendPlacement,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

REPO = pathlib.Path(__file__).resolve().parent.parent
OUTPUT = REPO / "roles/monitoring/files/specfleet-speculation.json"

PROMETHEUS = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
SELECTOR = '{job="$job", host=~"$host"}'
BOX = "host, model_name"
BOX_LEGEND = "{{host}} {{model_name}}"

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATED = "vllm:generation_tokens_total"


def per_second(counter, by=BOX):
    """A counter's rate over the chosen window, summed per box (vLLM's `engine` label summed away)."""
    return f"sum by ({by}) (rate({counter}{SELECTOR}[$window]))"


def query(expr, legend, ref_id="A"):
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).datasource(PROMETHEUS)


def graph(title, description, unit, expr, legend=BOX_LEGEND, floor=None, width=12):
    """A timeseries panel; `floor` adds the box's gate floor as a dashed second series to read it against."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(PROMETHEUS)
        .unit(unit)
        .span(width)
        .height(8)
        .with_target(query(expr, legend))
        .legend(
            common.VizLegendOptions()
            .display_mode(LegendDisplayMode.TABLE)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "min", "mean"])
        )
        .tooltip(common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI))
    )
    if unit == "percentunit":  # the ratios run 0..1: a fixed axis keeps boxes and floors comparable
        panel.min(0).max(1)
    if floor:
        panel.with_target(query(f'{floor}{{host=~"$host"}}', f"{BOX_LEGEND} floor", "B"))
        panel.override_by_query(
            "B", [model.DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]})]
        )
    return panel


def server_up():
    up = {
        "0": model.ValueMappingResult(text="DOWN", color="red", index=0),
        "1": model.ValueMappingResult(text="UP", color="green", index=1),
    }
    return (
        stat.Panel()
        .title("Server up")
        .description("Prometheus's scrape of each box's vLLM /metrics: DOWN when the server does not answer.")
        .datasource(PROMETHEUS)
        .span(8)
        .height(6)
        .with_target(query(f"up{SELECTOR}", "{{host}}"))
        .mappings([model.ValueMap(options=up)])
        .thresholds(
            dashboard.ThresholdsConfig()
            .mode(model.ThresholdsMode.ABSOLUTE)
            .steps([model.Threshold(value=None, color="red"), model.Threshold(value=1, color="green")])
        )
        .color_mode(BigValueColorMode.BACKGROUND)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )


def firing_alerts():
    # ALERTS carries the alerting rule's labels, not the scrape's job: select by host only.
    hidden = {"Time": True, "Value": True, "__name__": True, "alertstate": True}
    return (
        table.Panel()
        .title("Firing speculation alerts")
        .description("Alerts firing now for the selected boxes (Prometheus's ALERTS series).")
        .datasource(PROMETHEUS)
        .span(16)
        .height(6)
        .with_target(
            query('ALERTS{alertstate="firing", host=~"$host"}', "").instant().format(PromQueryFormat.TABLE)
        )
        .with_transformation(
            model.DataTransformerConfig(id_val="organize", options={"excludeByName": hidden})
        )
        .no_value("No alerts firing")
    )


def build():
    acceptance_length = f"1 + {per_second(ACCEPTED)} / {per_second(DRAFTS)}"
    acceptance_rate = f"{per_second(ACCEPTED)} / {per_second(DRAFT_TOKENS)}"
    per_position = (
        f"{per_second(ACCEPTED_PER_POS, BOX + ', position')}"
        f" / on(host, model_name) group_left {per_second(DRAFTS)}"
    )
    board = (
        dashboard.Dashboard("specfleet: EAGLE-3 speculation")
        .uid("specfleet-speculation")
        .tags(["specfleet", "vllm", "speculative-decoding"])
        .time("now-6h", "now")
        .refresh("1m")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        # The scrape job the monitoring role writes; hidden, as the dashboard means that job only.
        .with_variable(dashboard.ConstantVariable("job").value("specfleet-vllm"))
        .with_variable(
            dashboard.QueryVariable("host")
            .label("Box")
            .datasource(PROMETHEUS)
            .query('label_values(up{job="$job"}, host)')
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(model.VariableOption(text="All", value="$__all"))
        )
        .with_variable(
            dashboard.CustomVariable("window")
            .label("Rate window")
            .values("1m,5m,15m,1h")
            .current(model.VariableOption(text="5m", value="5m"))
        )
        .with_row(dashboard.Row("Acceptance"))
        .with_panel(
            graph(
                "Mean acceptance length",
                "Tokens each draft step yields: 1 + accepted / drafts over the window. Dashed: the gate's "
                "floor at the k the box drafts.",
                "short",
                acceptance_length,
                floor="specfleet:gate_floor:mean_acceptance_length",
            )
        )
        .with_panel(
            graph(
                "Acceptance rate",
                "Accepted / drafted tokens over the window. Dashed: the gate's floor at the box's k.",
                "percentunit",
                acceptance_rate,
                floor="specfleet:gate_floor:acceptance_rate",
            )
        )
        .with_panel(
            graph(
                "Per-position acceptance",
                "Share of drafts whose token at each position was accepted; it falls with position, "
                "and a flat tail says k is larger than the drafter earns.",
                "percentunit",
                per_position,
                legend=BOX_LEGEND + " pos {{position}}",
                width=24,
            )
        )
        .with_row(dashboard.Row("Drafting"))
        .with_panel(
            graph("Drafts per second", "Draft steps per second.", "short", per_second(DRAFTS), width=8)
        )
        .with_panel(
            graph(
                "Drafted tokens per draft (k)",
                "Draft tokens / drafts over the window: the k each box runs.",
                "short",
                f"{per_second(DRAFT_TOKENS)} / {per_second(DRAFTS)}",
                width=8,
            )
        )
        .with_panel(
            graph(
                "Generation tokens per second",
                "Output tokens per second.",
                "short",
                per_second(GENERATED),
                width=8,
            )
        )
        .with_row(dashboard.Row("Health"))
        .with_panel(server_up())
        .with_panel(firing_alerts())
        .build()
    )
    # Fixed panel ids keep the output stable and ?viewPanel= links working across regenerations.
    for number, panel in enumerate(board.panels, start=1):
        panel.id_val = number
    return json.dumps(board, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is stale")
    args = parser.parse_args()
    text = build()
    relative = OUTPUT.relative_to(REPO)
    if args.check:
        if not OUTPUT.is_file() or OUTPUT.read_text() != text:
            print(f"{relative} is not what scripts/build-dashboard.py builds: run it and commit the result")
            return 1
        print(f"{relative} is up to date")
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {relative}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
