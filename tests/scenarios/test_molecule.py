"""Each molecule scenario, end to end, as one test: a real container, a real vLLM.

tests/driver.py runs molecule's steps and, at the side_effect step, the scenario's Python side
effect. SPECFLEET_SCENARIOS (comma-separated) narrows the run. Each step's minutes, the model loads
its boxes timed and the scenario's slowest plays are printed in the summary at the end of the run.
"""

import os

import pytest
from driver import ROOT, Scenario

ALL_SCENARIOS = sorted(path.parent.name for path in ROOT.glob("molecule/*/molecule.yml"))
SELECTED = [s for s in os.environ.get("SPECFLEET_SCENARIOS", "").split(",") if s] or ALL_SCENARIOS


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.xdist_group(name)) for name in SELECTED]
)
def test_molecule_scenario(name, tmp_path, record_property):
    assert name in ALL_SCENARIOS, f"no molecule scenario named {name}"
    scenario = Scenario(name, tmp_path)
    try:
        scenario.test()
    finally:
        record_property("scenario_minutes", scenario.minutes)
        record_property("scenario_slowest_plays", scenario.slowest_plays())
        record_property("scenario_loads", scenario.loads)
