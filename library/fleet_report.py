#!/usr/bin/python
"""The fleet report: every box's record of what serves and its live counters, as one HTML page and a
Markdown summary (report.yml runs it on the controller)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_report
short_description: Write the fleet's speculation report (HTML with plots, Markdown) from every box's record
description:
  - Takes what report.yml gathered from each box (its last known good record, C(library/last_good.py), and
    its server's C(/metrics)) and writes one self-contained HTML page (inline SVG plots, no scripts, no
    network) and a Markdown summary, each replaced atomically and only when its content changed.
  - Per box, the drafter release, vLLM, the gate's acceptance with its interval, speedup, the NCCL
    environment's source, the age of each measurement, its timed loads (the last start's seconds to its first
    completion, the best of the same vLLM and model, failed starts), and alerts read from the live counters
    since the server started (acceptance under the box's floor at the k it drafts, a collapsed position,
    speculation off, a server that did not answer) and from its loads (a load much slower than its best).
    Boxes whose record is older than I(stale_days), or with alerts, stand out.
  - Plots, per box, the gate's mean acceptance length with its interval beside the floor, the per-position
    acceptance curves (gate and live), and tokens/s against concurrency per k where the box measured its
    speculation table (roles/spec_tune).
  - Fails with one line, writing nothing, when no box has a record yet.
options:
  boxes:
    description:
      - One entry per box, C(host) and what was read from it, C(record) (the C(last_good) facts), C(metrics)
        (the text of C(/metrics), or null when the server did not answer), C(loads) (the box's timed starts,
        roles/vllm_service's C(loads.json), oldest first), C(load_slow) (the box's own C(factor) and C(min_s),
        else I(load_slow_factor) and I(load_slow_min_s)), C(floors) (roles/served's C(served_floors)), and
        C(error) (why the box could not be read, or null).
    type: list
    elements: dict
    required: true
  dest:
    description: Directory for C(fleet.html) and C(fleet.md); created when missing.
    type: path
    required: true
  stale_days:
    description: A record older than this many days stands out as stale.
    type: float
    default: 7
  min_position_acceptance:
    description: A drafted position accepted in fewer than this fraction of drafts is an alert.
    type: float
    default: 0.05
  load_slow_factor:
    description:
      - A last load this many times the box's best of the same vLLM and model is an alert (as
        roles/monitoring's VllmLoadSlow), where it took at least I(load_slow_min_s); a box's own
        C(load_slow) wins.
    type: float
    default: 1.5
  load_slow_min_s:
    description: Seconds under which a slow load is not an alert.
    type: float
    default: 60
author: specfleet
"""

EXAMPLES = r"""
- name: Write the fleet report
  fleet_report:
    boxes: "{{ __report_boxes }}"
    dest: "{{ playbook_dir }}/reports"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
html:
  description: Path of the HTML page.
  returned: success
  type: str
markdown:
  description: Path of the Markdown summary.
  returned: success
  type: str
boxes:
  description: >-
    Per box, C(host), C(status) (C(ok), C(stale), C(alert), C(unreachable), C(no record)) and C(alerts).
  returned: success
  type: list
  elements: dict
"""

import datetime
import html
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.prometheus_text import PrometheusParseError, parse_samples
from ansible.module_utils.served_floors import floor_at
from ansible.module_utils.spec_metrics import SpecMetricsError, spec_series, window_metrics

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]


def _age_days(stamp, now):
    if not stamp:
        return None
    when = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return (now - when).total_seconds() / 86400


def _age(days):
    if days is None:
        return "never"
    return f"{days * 24:.0f} h" if days < 2 else f"{days:.0f} d"


def live_figures(text):
    """Spec-decode figures since the server started, from one /metrics text; None without speculation."""
    try:
        return window_metrics({}, spec_series(parse_samples(text)))
    except SpecMetricsError:
        return None


def live_alerts(box, live, min_position_acceptance):
    """What the counters since the server started say, one short line each."""
    if box.get("error"):
        return [f"not read: {box['error']}"]
    if box.get("metrics") is None:
        return ["server did not answer /metrics"]
    if live is None:
        return ["speculation off"] if (box.get("floors") or {}).get("speculation") else []
    alerts = []
    if live["num_drafts"]:
        k = live["num_draft_tokens"] / live["num_drafts"]
        for figure in ("mean_acceptance_length", "acceptance_rate"):
            floor = floor_at((box.get("floors") or {}).get("by_k"), figure, k)
            if floor and live[figure] is not None and live[figure] < floor:
                alerts.append(
                    f"{figure.replace('_', ' ')} {live[figure]:.2f} < floor {floor:.2f} (since start)"
                )
        alerts += [
            f"position {i} accepted {value:.3f}"
            for i, value in enumerate(live["per_position_acceptance"])
            if value < min_position_acceptance
        ]
    return alerts


def load_summary(loads):
    """The last served start with the best of the same vLLM and model, and the failed ones; None when the box
    kept no start."""
    served = [load for load in loads if load.get("outcome") == "served"]
    failed = [load for load in loads if load.get("outcome") == "failed"]
    if not served and not failed:
        return None
    last = served[-1] if served else None
    best = (
        min(
            s["seconds"]
            for s in served
            if (s.get("vllm"), s.get("model")) == (last.get("vllm"), last.get("model"))
        )
        if last
        else None
    )
    return {"last": last, "best": best, "failed": failed}


def load_cell(summary):
    if summary is None:
        return "none timed"
    cell = []
    if summary["last"]:
        last = summary["last"]
        cell.append(
            f"{last['seconds']:.1f} s ({last['unit']}, k={last.get('k')}), best {summary['best']:.1f} s"
        )
    if summary["failed"]:
        cell.append(f"{len(summary['failed'])} failed, last: {summary['failed'][-1].get('reason')}")
    return "; ".join(cell)


def load_alerts(summary, slow):
    last = (summary or {}).get("last")
    if not last or not summary["best"]:
        return []
    ratio = last["seconds"] / summary["best"]
    if ratio > slow["factor"] and last["seconds"] > slow["min_s"]:
        return [f"load {last['seconds']:.0f} s, {ratio:.1f}x its best {summary['best']:.0f} s"]
    return []


def summarise(box, now, params):
    record = box.get("record") or {}
    details = record.get("details") or {}
    gate = details.get("gate") or {}
    live = live_figures(box["metrics"]) if box.get("metrics") else None
    loads = load_summary(box.get("loads") or [])
    slow = {
        "factor": params["load_slow_factor"],
        "min_s": params["load_slow_min_s"],
        **(box.get("load_slow") or {}),
    }
    alerts = live_alerts(box, live, params["min_position_acceptance"]) + load_alerts(loads, slow)
    age = _age_days(record.get("recorded_at"), now)
    if box.get("error"):
        status = "unreachable"
    elif not record.get("recorded"):
        status = "no record"
    elif alerts:
        status = "alert"
    elif age is not None and age > params["stale_days"]:
        status = "stale"
    else:
        status = "ok"
    links = record.get("links") or {}
    nccl = details.get("nccl") or {}
    speculation = details.get("speculation") or {}
    return {
        "host": box["host"],
        "status": status,
        "alerts": alerts,
        "drafter": os.path.basename(str(links.get("drafter") or "")) or "none",
        "vllm": details.get("vllm_version") or "?",
        "recorded_at": record.get("recorded_at"),
        "age": _age(age),
        "gate": gate,
        "live": live,
        "nccl": nccl.get("chosen_by") or "?",
        "nccl_age": _age(_age_days(nccl.get("measured_at"), now))
        if nccl.get("measured_at")
        else "not measured",
        "speculation": speculation.get("chosen_by") or "?",
        "speculation_age": _age(_age_days(speculation.get("measured_at"), now))
        if speculation.get("measured_at")
        else "not measured",
        "table": speculation.get("table") or [],
        "loads": loads,
        "floor": (gate.get("floors") or {}).get("min_mean_acceptance_length"),
    }


def _interval(gate, figure):
    low_high = (gate.get("intervals") or {}).get(figure)
    value = gate.get(figure)
    if value is None:
        return "n/a"
    return f"{value:.2f} [{low_high[0]:.2f}, {low_high[1]:.2f}]" if low_high else f"{value:.2f}"


def rows(summaries):
    """The table, as cells (shared by the HTML and the Markdown)."""
    header = [
        "box",
        "status",
        "drafter release",
        "vLLM",
        "mean acceptance length",
        "acceptance rate",
        "speedup",
        "live mean length",
        "loads",
        "NCCL",
        "k chosen by",
        "recorded",
        "alerts",
    ]
    body = []
    for s in summaries:
        live = s["live"] or {}
        speedup = s["gate"].get("speedup")
        body.append(
            [
                s["host"],
                s["status"],
                s["drafter"],
                s["vllm"],
                _interval(s["gate"], "mean_acceptance_length"),
                _interval(s["gate"], "acceptance_rate"),
                f"{speedup:.2f}x" if speedup else "n/a",
                f"{live['mean_acceptance_length']:.2f}" if live.get("mean_acceptance_length") else "n/a",
                load_cell(s["loads"]),
                f"{s['nccl']} ({s['nccl_age']})",
                f"{s['speculation']} ({s['speculation_age']})",
                s["age"] + " ago" if s["recorded_at"] else "never",
                "; ".join(s["alerts"]) or "none",
            ]
        )
    return header, body


def markdown(summaries, generated):
    header, body = rows(summaries)
    lines = [f"# specfleet: the fleet's speculation ({generated})", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
    standing_out = [s for s in summaries if s["status"] != "ok"]
    lines += [
        "",
        f"{len(summaries)} boxes, {len(standing_out)} standing out" + (":" if standing_out else "."),
    ]
    lines += [
        f"- {s['host']}: {s['status']}" + (f" ({'; '.join(s['alerts'])})" if s["alerts"] else "")
        for s in standing_out
    ]
    return "\n".join(lines) + "\n"


def _shown(value):
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def tag(name, text="", **attributes):
    """One SVG element: attribute names with _ for - (a trailing _ dropped), floats to 0.1 px."""
    shown = " ".join(
        f'{key.rstrip("_").replace("_", "-")}="{html.escape(_shown(value))}"'
        for key, value in attributes.items()
    )
    return f"<{name} {shown}>{html.escape(str(text))}</{name}>" if text != "" else f"<{name} {shown}/>"


class Plot:
    """An SVG chart with linear axes; `x`/`y` map data to pixels."""

    def __init__(self, kind, title, x_range, y_range, width=560, height=260):
        self.kind, self.title, self.width, self.height = kind, title, width, height
        self.left, self.right, self.top, self.bottom = 48.0, 16.0, 28.0, 36.0
        self.x_range, self.y_range = x_range, y_range
        self.parts = []

    def x(self, value):
        low, high = self.x_range
        return self.left + (value - low) / ((high - low) or 1) * (self.width - self.left - self.right)

    def y(self, value):
        low, high = self.y_range
        span = self.height - self.top - self.bottom
        return self.height - self.bottom - (value - low) / ((high - low) or 1) * span

    def add(self, *elements):
        self.parts.extend(elements)

    def legend(self, index, text, colour):
        self.add(
            tag(
                "text",
                text,
                x=self.width - self.right,
                y=self.top + 12.0 * (index + 1),
                text_anchor="end",
                fill=colour,
            )
        )

    def svg(self, x_ticks, y_ticks, x_label, y_label):
        base, right, middle = self.y(self.y_range[0]), self.width - self.right, self.height / 2
        parts = [
            tag("line", x1=self.left, y1=base, x2=right, y2=base, stroke="#333"),
            tag("line", x1=self.left, y1=self.top, x2=self.left, y2=self.height - self.bottom, stroke="#333"),
        ]
        parts += [
            tag("text", t, x=self.x(v), y=self.height - self.bottom + 14, text_anchor="middle")
            for v, t in x_ticks
        ]
        for v, t in y_ticks:
            parts += [
                tag("line", x1=self.left, y1=self.y(v), x2=right, y2=self.y(v), stroke="#eee"),
                tag("text", t, x=self.left - 6, y=self.y(v) + 4, text_anchor="end"),
            ]
        parts += self.parts + [
            tag("text", self.title, x=self.width / 2, y=16.0, text_anchor="middle", font_weight="bold"),
            tag("text", x_label, x=self.width / 2, y=self.height - 4.0, text_anchor="middle"),
            tag(
                "text", y_label, x=12.0, y=middle, transform=f"rotate(-90 12 {middle})", text_anchor="middle"
            ),
        ]
        attributes = {"class": "plot", "data-plot": self.kind, "width": self.width, "height": self.height}
        opening = " ".join(f'{key}="{value}"' for key, value in attributes.items())
        return (
            f'<svg {opening} viewBox="0 0 {self.width} {self.height}" xmlns="http://www.w3.org/2000/svg" '
            f'font-size="11">{"".join(parts)}</svg>'
        )


def length_plot(summaries):
    gated = [s for s in summaries if s["gate"].get("mean_acceptance_length")]
    top = max([1 + len(s["gate"].get("per_position_acceptance") or [0] * 3) for s in gated] + [4])
    title = "Mean acceptance length at the gate, with its interval and floor"
    plot = Plot("mean-acceptance-length", title, (0, max(1, len(gated))), (1, top))
    for i, s in enumerate(gated):
        centre, value = plot.x(i + 0.5), s["gate"]["mean_acceptance_length"]
        low, high = (s["gate"].get("intervals") or {}).get("mean_acceptance_length") or (value, value)
        colour = "#d62728" if s["status"] != "ok" else "#1f77b4"
        height = plot.y(1) - plot.y(value)
        plot.add(
            tag(
                "rect",
                data_host=s["host"],
                x=centre - 18,
                y=plot.y(value),
                width=36,
                height=height,
                fill=colour,
            ),
            tag("line", x1=centre, y1=plot.y(low), x2=centre, y2=plot.y(high), stroke="#000", stroke_width=2),
        )
        if s["floor"]:
            floor = plot.y(s["floor"])
            plot.add(
                tag(
                    "line",
                    class_="floor",
                    x1=centre - 26,
                    y1=floor,
                    x2=centre + 26,
                    y2=floor,
                    stroke="#000",
                    stroke_dasharray="4 3",
                )
            )
    ticks = [(i + 0.5, s["host"]) for i, s in enumerate(gated)]
    return plot.svg(
        ticks, [(v, v) for v in range(1, int(top) + 1)], "box (dashed: its floor)", "mean acceptance length"
    )


def _polyline(plot, name, points, colour, dash=""):
    joined = " ".join(f"{plot.x(x):.1f},{plot.y(y):.1f}" for x, y in points)
    return tag(
        "polyline",
        data_series=name,
        points=joined,
        fill="none",
        stroke=colour,
        stroke_width=2,
        stroke_dasharray=dash,
    )


def position_plot(summaries):
    curves = []
    for s in summaries:
        if s["gate"].get("per_position_acceptance"):
            curves.append((s["host"] + " (gate)", s["gate"]["per_position_acceptance"], ""))
        if s["live"] and s["live"]["per_position_acceptance"]:
            curves.append((s["host"] + " (live)", s["live"]["per_position_acceptance"], "5 3"))
    positions = max([len(c[1]) for c in curves] + [1])
    plot = Plot("per-position-acceptance", "Per-position acceptance", (0, max(1, positions - 1)), (0, 1))
    for i, (name, values, dash) in enumerate(curves):
        colour = PALETTE[i // 2 % len(PALETTE)]
        plot.add(_polyline(plot, name, list(enumerate(values)), colour, dash))
        plot.legend(i, name, colour)
    ticks = [(v / 4, v / 4) for v in range(5)]
    return plot.svg([(p, p) for p in range(positions)], ticks, "draft position", "accepted / drafts")


def throughput_plot(summary):
    table = summary["table"]
    concurrencies = sorted({row["concurrency"] for row in table})
    top = max(row["tokens_per_second"] for row in table) * 1.1
    title = f"{summary['host']}: tokens/s by concurrency, per k"
    plot = Plot("tokens-per-second", title, (0, max(1, len(concurrencies) - 1)), (0, top))
    for i, k in enumerate(sorted({row["k"] for row in table})):
        points = sorted(
            (concurrencies.index(r["concurrency"]), r["tokens_per_second"]) for r in table if r["k"] == k
        )
        colour = PALETTE[i % len(PALETTE)]
        plot.add(_polyline(plot, f"k={k}", points, colour))
        plot.legend(i, f"k={k}", colour)
    y_ticks = [(top * i / 4, f"{top * i / 4:.0f}") for i in range(5)]
    return plot.svg(list(enumerate(concurrencies)), y_ticks, "concurrency", "tokens/s")


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>specfleet: the fleet's speculation</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
tr.ok td.status {{ color: #1a7f37; }}
tr.standing-out td {{ background: #fff1f0; }}
tr.standing-out td.status {{ color: #cf222e; font-weight: bold; }}
.plots {{ display: flex; flex-wrap: wrap; gap: 24px; margin-top: 24px; }}
</style></head>
<body>
<h1>specfleet: the fleet's speculation</h1>
<p>{generated}: {count} boxes, <span id="standing-out">{standing_out}</span> standing out
(stale after {stale_days:g} days). Gate figures are the last known good of each box; live figures are
the server's counters since it started.</p>
<table id="boxes"><thead><tr>{header}</tr></thead><tbody>
{body}
</tbody></table>
<div class="plots">
{plots}
</div>
</body></html>
"""


def page(summaries, generated, stale_days):
    header, body = rows(summaries)
    html_rows = []
    for summary, row in zip(summaries, body):
        css = "ok" if summary["status"] == "ok" else "standing-out"
        cells = "".join(
            ('<td class="status">' if i == 1 else "<td>") + f"{html.escape(cell)}</td>"
            for i, cell in enumerate(row)
        )
        html_rows.append(f'<tr class="box {css}" data-host="{html.escape(summary["host"])}">{cells}</tr>')
    plots = [length_plot(summaries), position_plot(summaries)]
    plots += [throughput_plot(s) for s in summaries if s["table"]]
    return PAGE.format(
        generated=html.escape(generated),
        count=len(summaries),
        standing_out=sum(s["status"] != "ok" for s in summaries),
        stale_days=stale_days,
        header="".join(f"<th>{html.escape(h)}</th>" for h in header),
        body="\n".join(html_rows),
        plots="\n".join(plots),
    )


def write(module, path, content):
    """Replace `path` atomically when its content differs; True when it did (or would, in check mode)."""
    try:
        with open(path, encoding="utf-8") as current:
            if current.read() == content:
                return False
    except FileNotFoundError:
        pass
    if not module.check_mode:
        handle, staged = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".fleet-report-")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(content)
        os.chmod(staged, 0o644)
        module.atomic_move(staged, path)
    return True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            boxes=dict(type="list", elements="dict", required=True),
            dest=dict(type="path", required=True),
            stale_days=dict(type="float", default=7),
            min_position_acceptance=dict(type="float", default=0.05),
            load_slow_factor=dict(type="float", default=1.5),
            load_slow_min_s=dict(type="float", default=60),
        ),
        supports_check_mode=True,
    )
    params = module.params
    boxes = sorted(params["boxes"], key=lambda box: box["host"])
    if not any((box.get("record") or {}).get("recorded") for box in boxes):
        module.fail_json(
            msg=f"no box of the {len(boxes)} in the inventory has a record of what serves yet: a deploy "
            "that passes writes it (deploy.yml); nothing was written"
        )
    now = datetime.datetime.now(datetime.timezone.utc)
    try:
        summaries = [summarise(box, now, params) for box in boxes]
    except PrometheusParseError as error:
        module.fail_json(msg=f"a box's /metrics could not be read: {error}")
    # The minute, not the second: a report of the same records made in the same minute is unchanged.
    generated = now.strftime("%Y-%m-%d %H:%M UTC")
    if not module.check_mode:
        os.makedirs(params["dest"], exist_ok=True)
    html_path = os.path.join(params["dest"], "fleet.html")
    markdown_path = os.path.join(params["dest"], "fleet.md")
    changed = write(module, html_path, page(summaries, generated, params["stale_days"]))
    changed = write(module, markdown_path, markdown(summaries, generated)) or changed
    module.exit_json(
        changed=changed,
        html=html_path,
        markdown=markdown_path,
        boxes=[{"host": s["host"], "status": s["status"], "alerts": s["alerts"]} for s in summaries],
    )


if __name__ == "__main__":
    main()
