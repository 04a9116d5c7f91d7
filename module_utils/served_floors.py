"""The box's floor table as roles/served hands it on (served_floors.by_k: {k: {figure: floor}}), read at a
mean drafted length. The watcher (on the box, beside its script) and the fleet report (on the controller) read
it the same way; the floors themselves are computed once, by filter_plugins/spec_floors.py."""

from __future__ import annotations


def floor_at(by_k, figure, k):
    """The floor on `figure` at the whole k nearest `k`, within the table; None: not gated on it."""
    table = {int(at): floors for at, floors in (by_k or {}).items()}
    if not table:
        return None
    return table[min(max(1, round(k)), max(table))].get(figure)
