"""The PromQL behind each panel of the generated dashboard, with its dashboard variables filled in.

So that a test can run every panel's query against a real Prometheus: a query that parses but
matches nothing (a renamed metric or label) fails there, not as an empty graph when it is needed.
"""

import re

# $name and ${name}, and ${name:format} (the format is ignored: values are substituted as given).
VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)")


def panel_queries(dashboard_json, variables):
    """(panel title, expr) for every target of every panel, rows' nested panels included.

    `variables` maps a variable's name to the string that replaces it, e.g.
    {"window": "5m", "job": "specfleet-vllm", "host": ".*"}; a variable it does not name raises KeyError.
    """
    queries = []
    for panel in _panels(dashboard_json.get("panels", [])):
        for target in panel.get("targets", []):
            queries.append((panel["title"], _substitute(target["expr"], variables, panel["title"])))
    return queries


def _panels(panels):
    for panel in panels:
        yield panel
        # A collapsed row holds its panels itself; an open one has them at the top level after it.
        yield from _panels(panel.get("panels", []))


def _substitute(expr, variables, title):
    def value(match):
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise KeyError(f"panel {title!r}: no value for dashboard variable ${name}")
        return variables[name]

    return VARIABLE.sub(value, expr)
