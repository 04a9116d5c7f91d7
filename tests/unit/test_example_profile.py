"""The example scenario deploys inventory/example as written: each of its sim overrides
(molecule/example/sim_overrides.yml) says why a container cannot do what the profile says, and names a
variable the profile or a role knows; its boxes are the profile's hosts."""

import copy
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = ROOT / "molecule/example/sim_overrides.yml"


def known_names(profile: Path) -> set[str]:
    """Variables a role defaults, the profile sets, or the profile's values read (its vaulted key)."""
    names = set()
    for path in [*ROOT.glob("roles/*/defaults/main.yml"), *profile.glob("*_vars/*.yml")]:
        values = yaml.safe_load(path.read_text()) or {}
        names |= set(values)
        names |= set(re.findall(r"\{\{\s*([a-z_][a-z0-9_]*)", yaml.safe_dump(values)))
    return names


def problems(document: dict) -> list[str]:
    """One line per thing wrong with an overrides document."""
    found = [f"unexpected key {key}" for key in sorted(set(document) - {"profile", "overrides"})]
    known = known_names(ROOT / document["profile"])
    for name, entry in document["overrides"].items():
        if not isinstance(entry, dict) or set(entry) != {"value", "reason"}:
            found.append(f"{name}: an override is a value and its reason")
        elif not str(entry["reason"] or "").strip():
            found.append(f"{name}: no reason given")
        if name not in known:
            found.append(f"{name}: neither the profile nor a role knows this variable")
    return found


def test_every_override_has_its_reason():
    assert problems(yaml.safe_load(OVERRIDES.read_text())) == []


def test_an_override_without_a_reason_is_refused():
    document = yaml.safe_load(OVERRIDES.read_text())
    unreasoned, unknown = copy.deepcopy(document), copy.deepcopy(document)
    unreasoned["overrides"]["vllm_platform"]["reason"] = " "
    del unreasoned["overrides"]["vllm_version"]["reason"]
    unknown["overrides"]["vllm_plattform"] = {"value": "cpu", "reason": "a typo"}
    assert problems(unreasoned) == [
        "vllm_platform: no reason given",
        "vllm_version: an override is a value and its reason",
    ]
    assert problems(unknown) == ["vllm_plattform: neither the profile nor a role knows this variable"]


def test_the_boxes_are_the_profiles_hosts():
    profile = ROOT / yaml.safe_load(OVERRIDES.read_text())["profile"]
    hosts = yaml.safe_load((profile / "hosts.yml").read_text())["all"]["children"]["gpu_boxes"]["hosts"]
    platforms = yaml.safe_load((ROOT / "molecule/example/molecule.yml").read_text())["platforms"]
    named = [platform["name"].removeprefix("specfleet-${MOLECULE_SCENARIO_NAME}-") for platform in platforms]
    assert sorted(named) == sorted(hosts)
    # Every host_vars file of the profile belongs to one of them (none is left out of the scenario).
    assert {path.stem for path in (profile / "host_vars").glob("*.yml")} <= set(hosts)
