"""spec_floors: a box's gate floors at every k it may draft, computed once from its inventory (roles/served's
served_floors) and handed to every consumer: the gate, the tuner, the watcher, the fleet report and the
Prometheus rules. The only place the floor model lives.

The model: a floor stated at floors_at_k means a drafter quality, the per-position acceptance alpha it
implies with acceptance decaying geometrically (position i accepted with probability alpha^i, i = 1..k), so
that the mean acceptance length at k is 1 + alpha + ... + alpha^k. 2.2 at k=3 is alpha 0.607, which is 1.61
at k=1, 1.98 at k=2 and 2.34 at k=4. An acceptance-rate floor r at k is the mean length 1 + r * k there.
"""

from ansible.errors import AnsibleFilterError

FIGURES = ("mean_acceptance_length", "acceptance_rate")


def _geometric_sum(alpha, k):
    return sum(alpha**i for i in range(1, k + 1))


def floor_alpha(mean_length_floor, reference_k):
    """The per-position acceptance alpha that `mean_length_floor` at `reference_k` means."""
    if reference_k < 1:
        raise ValueError(f"k must be at least 1, got floors_at_k={reference_k}")
    if not 1 <= mean_length_floor <= 1 + reference_k:
        raise ValueError(f"a mean acceptance length floor at k={reference_k} lies in [1, {1 + reference_k}]")
    target = mean_length_floor - 1
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection: the sum grows with alpha
        middle = (low + high) / 2
        low, high = (middle, high) if _geometric_sum(middle, reference_k) < target else (low, middle)
    return (low + high) / 2


def spec_floors(figures, floors_at_k, max_k):
    """{alpha: {figure: alpha, or None where the floor is taken as stated}, by_k: {"k": {figure: floor}}}
    for k = 1..max_k, from the stated floors `figures` ({figure: floor}, only those gated). floors_at_k 0
    takes each floor as stated at every k; at floors_at_k itself a floor is exactly as stated."""
    try:
        reference, max_k = int(floors_at_k), int(max_k)
        stated = {figure: float(floor) for figure, floor in (figures or {}).items()}
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError(f"spec_floors: {error}") from error
    unknown = sorted(set(stated) - set(FIGURES))
    if unknown:
        raise AnsibleFilterError(f"spec_floors: no floor model for {', '.join(unknown)}")
    alpha, by_k = {}, {str(k): {} for k in range(1, max(max_k, reference, 1) + 1)}
    for figure, floor in stated.items():
        if reference == 0:
            alpha[figure] = None
            for floors in by_k.values():
                floors[figure] = floor
            continue
        mean_length = floor if figure == "mean_acceptance_length" else 1 + floor * reference
        try:
            alpha[figure] = floor_alpha(mean_length, reference)
        except ValueError as error:
            raise AnsibleFilterError(f"spec_floors: {figure} {floor}: {error}") from error
        for k, floors in by_k.items():
            at_k = 1 + _geometric_sum(alpha[figure], int(k))
            converted = at_k if figure == "mean_acceptance_length" else (at_k - 1) / int(k)
            floors[figure] = floor if int(k) == reference else round(converted, 4)
        alpha[figure] = round(alpha[figure], 6)
    return {"alpha": alpha, "by_k": by_k}


class FilterModule:
    def filters(self):
        return {"spec_floors": spec_floors}
