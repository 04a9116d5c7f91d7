"""Shared pytest setup: import the repo's modules the way Ansible would find them."""

import json
import pathlib
import sys

import ansible.module_utils
import pytest
from ansible.module_utils.common import warnings
from ansible.module_utils.testing import patch_module_args

REPO = pathlib.Path(__file__).resolve().parent.parent

# library/ holds the modules; tests import them by name (e.g. `import gpu_topology`).
sys.path.insert(0, str(REPO / "library"))
# tests/ holds the scenario driver and the box client (`from driver import ...`).
sys.path.insert(0, str(REPO / "tests"))

# module_utils/ holds what several modules share; Ansible resolves `ansible.module_utils.<name>` from there.
if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """With `--dist loadgroup`, the unit tests share one worker (they are quick, and the scenario
    workers wait on servers); each scenario is a group of its own (tests/scenarios)."""
    for item in items:
        if "tests/unit/" in item.nodeid and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("unit"))


@pytest.fixture
def sim_nvidia_smi(tmp_path, monkeypatch):
    """The sim box's nvidia-smi over a recorded box of tests/fixtures/nvidia-smi, with a driver version:
    sim_nvidia_smi(capture, driver) -> (its recorded data directory, the binary)."""

    def install(capture, driver):
        import shutil

        data = tmp_path / "nvidia-smi"
        shutil.copytree(REPO / "tests" / "fixtures" / "nvidia-smi" / capture, data)
        (data / "driver-version").write_text(driver + "\n")
        binary = tmp_path / "nvidia-smi-bin"
        shutil.copy(REPO / "sim" / "roles" / "sim_box" / "files" / "nvidia-smi", binary)
        binary.chmod(0o755)
        monkeypatch.setenv("SIM_NVIDIA_SMI_DATA", str(data))
        return data, binary

    return install


@pytest.fixture
def run_module(capsys):
    """Run a module's main() with the given arguments; return its JSON result."""

    def run(module, args):
        # A module's warnings are module-level state, one process per run in Ansible: in this process, an
        # earlier test's warnings would be this run's too.
        warnings._global_warnings.clear()
        warnings._global_deprecations.clear()
        with patch_module_args(args), pytest.raises(SystemExit):
            module.main()
        return json.loads(capsys.readouterr().out)

    return run


def pytest_terminal_summary(terminalreporter):
    """Minutes per molecule step of each scenario, the model loads its boxes timed, and its slowest plays
    (recorded by tests/scenarios/test_molecule.py): where the next minutes of the suite are."""
    rows = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            properties = dict(getattr(report, "user_properties", ()))
            minutes = properties.get("scenario_minutes")
            if minutes and getattr(report, "when", "") == "call":
                name = report.nodeid.split("@")[0].rsplit("[", 1)[-1].rstrip("]")
                steps = ", ".join(f"{step} {value:.1f}" for step, value in minutes.items())
                plays = [
                    f"  {value:5.0f} s  {line[:110]}"
                    for value, line in properties.get("scenario_slowest_plays", [])
                ]
                loads = properties.get("scenario_loads") or {"count": 0, "seconds": 0.0}
                said = f"{loads['count']} model loads, {loads['seconds'] / 60:.1f} min"
                rows.append(
                    "\n".join([f"{name:<18} {sum(minutes.values()):5.1f} min  ({steps}; {said})", *plays])
                )
    if rows:
        terminalreporter.write_sep("-", "scenario minutes, model loads (and each scenario's slowest plays)")
        for row in sorted(rows):
            for line in row.splitlines():
                terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def torch_python():
    """Python of the cached CPU-torch venv (tests/vllm_wheels.py); skips where it cannot be built."""
    import vllm_wheels

    try:
        return vllm_wheels.torch_python()
    except vllm_wheels.Unavailable as exc:
        vllm_wheels.missing(str(exc))
