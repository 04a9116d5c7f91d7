"""Each molecule scenario, end to end, as one test: a real container, a real vLLM.

SPECFLEET_SCENARIOS (comma-separated) narrows the run; molecule's own output streams live.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALL_SCENARIOS = sorted(path.parent.name for path in ROOT.glob("molecule/*/molecule.yml"))
SELECTED = [s for s in os.environ.get("SPECFLEET_SCENARIOS", "").split(",") if s] or ALL_SCENARIOS


@pytest.mark.parametrize("scenario", SELECTED)
def test_molecule_scenario(scenario, capsys):
    assert scenario in ALL_SCENARIOS, f"no molecule scenario named {scenario}"
    molecule = Path(sys.executable).with_name("molecule")
    with capsys.disabled():
        print(f"\n--- molecule test -s {scenario}", flush=True)
        result = subprocess.run([str(molecule), "test", "-s", scenario], cwd=ROOT, check=False)
    assert result.returncode == 0, (
        f"molecule test -s {scenario} failed (exit {result.returncode}); see its output above"
    )
