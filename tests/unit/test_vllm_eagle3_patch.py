"""vllm_eagle3_patch against the real vLLM release sources (wheels from PyPI, cached as source tars).

The module's own checks (hashes recorded in the patches) are not trusted here: the tests compare
with the bytes of the real wheels and read the patched code with `ast`, and a tiny random
DeepseekV3 runs through the real patched model code on CPU (tests/vllm_eagle3_forward_probe.py).
"""

import ast
import hashlib
import py_compile
import shutil
import subprocess
from pathlib import Path

import pytest
import vllm_eagle3_patch as patch_module
import vllm_wheels

ROOT = Path(__file__).resolve().parents[2]
PATCH_FILES = sorted((ROOT / "roles/vllm_eagle3_patch/files").glob("*.diff"))
PATCHES = [path.read_text() for path in PATCH_FILES]
TARGETS = (
    "vllm/config/speculative.py",
    "vllm/model_executor/models/deepseek_v2.py",
    "vllm/model_executor/models/kimi_k25.py",
    "vllm/v1/spec_decode/eagle.py",
)
# What the module reads besides the targets.
ONLY = (*TARGETS, "vllm/__init__.py", "vllm/_version.py")
WHITELIST = {"0.16.0": "eagle3_target_supported", "0.17.1": "aux_hidden_states_supported"}
NEW_MODEL_TYPES = {"deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25"}


def release_tar(version):
    try:
        return vllm_wheels.source_tar(version)
    except vllm_wheels.Unavailable as exc:
        vllm_wheels.missing(f"the real vLLM {version} wheel cannot be had here: {exc}")


@pytest.fixture(params=vllm_wheels.SUPPORTED)
def release(request, tmp_path):
    """(version, vllm package dir) with the real upstream target files of a supported release."""
    release_tar(request.param)
    return request.param, vllm_wheels.unpack(request.param, tmp_path / "site-packages", ONLY)


def snapshot(vllm_dir):
    """Every file under the package (bytes), pyc caches left out."""
    return {
        str(path.relative_to(vllm_dir)): path.read_bytes()
        for path in sorted(vllm_dir.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def upstream_bytes(version):
    """The target files exactly as the wheel ships them, from a fresh extraction."""
    import tarfile

    with tarfile.open(release_tar(version)) as archive:
        return {name: archive.extractfile(name).read() for name in TARGETS}


def classes(tree):
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def method_names(cls):
    return {node.name for node in cls.body if isinstance(node, ast.FunctionDef)}


def base_names(cls):
    return {base.id if isinstance(base, ast.Name) else ast.unparse(base) for base in cls.bases}


def test_each_supported_line_has_one_patch_and_its_header_names_the_real_upstream_files():
    parsed = [patch_module.parse_patch(text) for text in PATCHES]
    assert sorted(p["range"] for p in parsed) == ["0.16", "0.17"]
    for version in vllm_wheels.SUPPORTED:
        patch = patch_module.select_patch(PATCHES, version)
        assert version in patch["verified"]
        upstream = upstream_bytes(version)
        assert [f["path"] for f in patch["files"]] == list(TARGETS)
        for item in patch["files"]:
            assert item["pre"] == hashlib.sha256(upstream[item["path"]]).hexdigest(), item["path"]


def test_the_diffs_are_plain_unified_diffs_gnu_patch_applies(tmp_path, release):
    version, vllm_dir = release
    if not shutil.which("patch"):
        vllm_wheels.missing("GNU patch is not installed")
    diff = PATCH_FILES[[p.name for p in PATCH_FILES].index(f"vllm-{version.rsplit('.', 1)[0]}.diff")]
    done = subprocess.run(
        ["patch", "-p1", "--dry-run", "--force", "-i", str(diff)],
        cwd=vllm_dir.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "offset" not in done.stdout and "fuzz" not in done.stdout, done.stdout


def test_apply_patches_every_file_compiles_and_keeps_byte_exact_backups(release):
    version, vllm_dir = release
    before = snapshot(vllm_dir)
    result = patch_module.run(str(vllm_dir), PATCHES)
    assert result["vllm_version"] == version
    assert result["applicable"] and result["changed"]
    assert result["patched_files"] == list(TARGETS)
    assert set(result["files"].values()) == {"patched"}
    for name in TARGETS:
        relative = name[len("vllm/") :]
        assert (vllm_dir / (relative + ".specfleet-orig")).read_bytes() == before[relative]
        assert (vllm_dir / relative).read_bytes() != before[relative]
        compile((vllm_dir / relative).read_bytes(), str(vllm_dir / relative), "exec")
        # The module byte-compiled it next to the source.
        cache = vllm_dir / Path(relative).parent / "__pycache__"
        assert list(cache.glob(Path(relative).stem + ".*.pyc")), relative


def test_patched_sources_read_as_upstream_0_18_has_it(release):
    version, vllm_dir = release
    patch_module.run(str(vllm_dir), PATCHES)

    tree = ast.parse((vllm_dir / "model_executor/models/deepseek_v2.py").read_text())
    found = classes(tree)
    causal_lm = found["DeepseekV2ForCausalLM"]
    assert "SupportsEagle3" in base_names(causal_lm)
    assert {"set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers"} <= method_names(causal_lm)
    assert "DeepseekV2ForCausalLM" in base_names(found["DeepseekV3ForCausalLM"])
    forward = next(n for n in found["DeepseekV2Model"].body if getattr(n, "name", "") == "forward")
    source = ast.unparse(forward)
    assert "aux_hidden_states.append(hidden_states + residual)" in source
    assert "return (hidden_states, aux_hidden_states)" in source
    assert "self.aux_hidden_state_layers = tuple[int, ...]()" in ast.unparse(found["DeepseekV2Model"])

    tree = ast.parse((vllm_dir / "config/speculative.py").read_text())
    lists = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == WHITELIST[version]
    ]
    assert len(lists) == 1
    names = {element.value for element in lists[0].elts}
    assert names >= NEW_MODEL_TYPES and "llama" in names

    kimi = classes(ast.parse((vllm_dir / "model_executor/models/kimi_k25.py").read_text()))
    wrapper = kimi["KimiK25ForConditionalGeneration"]
    assert "SupportsEagle3" in base_names(wrapper)
    for name in ("set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers"):
        body = ast.unparse(next(n for n in wrapper.body if getattr(n, "name", "") == name))
        assert f"self.language_model.{name}(" in body

    proposer = ast.unparse(ast.parse((vllm_dir / "v1/spec_decode/eagle.py").read_text()))
    assert (
        "elif self.get_model_name(target_model) == 'KimiK25ForConditionalGeneration':\n"
        "                self.model.config.image_token_index = target_model.config.media_placeholder_token_id"
    ) in proposer


def test_second_apply_changes_nothing(release):
    _, vllm_dir = release
    patch_module.run(str(vllm_dir), PATCHES)
    before = snapshot(vllm_dir)
    mtimes = {name: (vllm_dir / name[5:]).stat().st_mtime_ns for name in TARGETS}
    result = patch_module.run(str(vllm_dir), PATCHES)
    assert not result["changed"] and result["patched_files"] == []
    assert snapshot(vllm_dir) == before
    assert mtimes == {name: (vllm_dir / name[5:]).stat().st_mtime_ns for name in TARGETS}


@pytest.mark.parametrize("backup", [True, False], ids=["from-backup", "reverse-diff"])
def test_absent_restores_the_upstream_bytes(release, backup):
    version, vllm_dir = release
    pristine = snapshot(vllm_dir)
    patch_module.run(str(vllm_dir), PATCHES, backup=backup)
    result = patch_module.run(str(vllm_dir), PATCHES, state="absent")
    assert result["changed"] and result["patched_files"] == list(TARGETS)
    assert snapshot(vllm_dir) == pristine  # no backups left, every byte back
    assert {name: (vllm_dir / name[5:]).read_bytes() for name in TARGETS} == upstream_bytes(version)
    again = patch_module.run(str(vllm_dir), PATCHES, state="absent")
    assert not again["changed"]


def test_check_mode_reports_and_diffs_without_writing(release, run_module):
    _, vllm_dir = release
    pristine = snapshot(vllm_dir)
    args = {
        "vllm_path": str(vllm_dir),
        "patches": PATCHES,
        "_ansible_check_mode": True,
        "_ansible_diff": True,
    }
    result = run_module(patch_module, args)
    assert result["changed"] and result["patched_files"] == list(TARGETS)
    assert set(result["files"].values()) == {"upstream"}
    assert [d["before_header"] for d in result["diff"]] == list(TARGETS)
    deepseek = result["diff"][1]
    assert "SupportsEagle3" in deepseek["after"] and "SupportsEagle3" not in deepseek["before"]
    assert snapshot(vllm_dir) == pristine
    assert not list(vllm_dir.rglob("__pycache__"))


def test_without_diff_mode_no_diff_is_returned(release, run_module):
    _, vllm_dir = release
    result = run_module(patch_module, {"vllm_path": str(vllm_dir), "patches": PATCHES})
    assert result["changed"] and "diff" not in result


@pytest.mark.parametrize("patch_first", [False, True], ids=["upstream", "patched"])
def test_an_altered_file_is_refused_and_nothing_changes(release, run_module, patch_first):
    _, vllm_dir = release
    if patch_first:
        patch_module.run(str(vllm_dir), PATCHES)
    with open(vllm_dir / "model_executor/models/kimi_k25.py", "ab") as handle:
        handle.write(b"# a local hotfix\n")
    before = snapshot(vllm_dir)
    for state in ("present", "absent"):
        result = run_module(patch_module, {"vllm_path": str(vllm_dir), "patches": PATCHES, "state": state})
        assert result.get("failed") and not result["changed"]
        assert "vllm/model_executor/models/kimi_k25.py" in result["msg"]
        assert "nothing was changed" in result["msg"]
        assert "deepseek_v2" not in result["msg"]
        assert snapshot(vllm_dir) == before


def test_a_failure_while_writing_puts_every_file_back(release, monkeypatch):
    _, vllm_dir = release
    pristine = snapshot(vllm_dir)

    def broken(path, **kwargs):
        raise py_compile.PyCompileError(SyntaxError, SyntaxError("simulated"), path)

    monkeypatch.setattr(patch_module.py_compile, "compile", broken)
    with pytest.raises(py_compile.PyCompileError):
        patch_module.run(str(vllm_dir), PATCHES, backup=False)
    assert snapshot(vllm_dir) == pristine


def test_vllm_0_33_is_not_applicable_and_untouched(tmp_path, run_module):
    release_tar(vllm_wheels.NOT_APPLICABLE)
    vllm_dir = vllm_wheels.unpack(vllm_wheels.NOT_APPLICABLE, tmp_path / "sp", ONLY)
    before = snapshot(vllm_dir)
    result = run_module(patch_module, {"vllm_path": str(vllm_dir), "patches": PATCHES})
    assert result["vllm_version"] == "0.33.0"
    assert result["applicable"] is False and result["changed"] is False
    assert result["patched_files"] == []
    assert snapshot(vllm_dir) == before


def test_version_comes_from_the_dist_info_without_version_py(release):
    version, vllm_dir = release
    (vllm_dir / "_version.py").unlink()
    assert patch_module.read_version(str(vllm_dir)) == version


def test_a_release_line_without_a_patch_is_reported_not_applicable(release, run_module):
    _, vllm_dir = release
    (vllm_dir / "_version.py").write_text("__version__ = version = '0.15.1'\n")
    result = run_module(patch_module, {"vllm_path": str(vllm_dir), "patches": PATCHES})
    assert result["applicable"] is False and not result["changed"]
    assert "no patch for this release line" in result["msg"]


def test_not_a_vllm_package_fails_with_one_line(tmp_path, run_module):
    result = run_module(patch_module, {"vllm_path": str(tmp_path), "patches": PATCHES})
    assert result["failed"] and "not an installed vllm package" in result["msg"]


# --- Behaviour: the real patched model code, run on CPU ------------------------------------------


def probe(python, site_packages):
    script = ROOT / "tests/vllm_eagle3_forward_probe.py"
    return vllm_wheels.run_marked(python, script, str(site_packages), marker="PROBE", timeout=300)


@pytest.mark.parametrize("version", vllm_wheels.SUPPORTED)
def test_patched_deepseek_v3_returns_aux_states_of_exactly_the_requested_layers(
    tmp_path, torch_python, version
):
    release_tar(version)
    site_packages = tmp_path / "site-packages"
    vllm_dir = vllm_wheels.unpack(version, site_packages)
    assert patch_module.run(str(vllm_dir), PATCHES)["changed"]
    report = probe(torch_python, site_packages)
    assert report["vllm_file"] == str(vllm_dir / "model_executor/models/deepseek_v2.py")
    assert report["supports_eagle3"] and "SupportsEagle3" in report["classes"]
    assert report["real_mlp"] == "DeepseekV2MLP"
    assert report["plain_is_tensor"], "no layers requested: the hidden states alone"
    assert report["with_aux_is_pair"] and report["aux_count"] == 2
    assert report["aux_equal_layer_inputs"] == [True, True], (
        "hidden_states + residual at the input of 1 and 2"
    )
    assert report["aux_differ_from_other_layers"]
    assert report["final_hidden_unchanged"], "capturing does not change the model's output"
    assert report["plain_again_is_tensor"]
    assert report["default_layers"] == [2, 5 // 2, 5 - 3]
    assert report["kimi_supports_eagle3"]
    assert report["kimi_forwards_set"] == [2, 3] and report["kimi_forwards_get"] == [2, 2, 2]


def test_unpatched_deepseek_v3_lacks_the_interface(tmp_path, torch_python):
    """The control: the same probe on the upstream 0.17.1 sources finds no EAGLE-3 support."""
    version = vllm_wheels.SUPPORTED[-1]
    release_tar(version)
    site_packages = tmp_path / "site-packages"
    vllm_wheels.unpack(version, site_packages)
    report = probe(torch_python, site_packages)
    assert report["supports_eagle3"] is False and "SupportsEagle3" not in report["classes"]


def test_a_venv_is_searched_for_the_package(tmp_path, run_module):
    """With venv, the module finds lib/python3.X/site-packages/vllm itself (no call to the venv's Python)."""
    release_tar(vllm_wheels.NOT_APPLICABLE)
    venv = tmp_path / "venv"
    vllm_dir = vllm_wheels.unpack(vllm_wheels.NOT_APPLICABLE, venv / "lib/python3.11/site-packages", ONLY)
    result = run_module(patch_module, {"venv": str(venv), "patches": PATCHES})
    assert result["vllm_path"] == str(vllm_dir)
    assert (result["vllm_version"], result["applicable"], result["changed"]) == ("0.33.0", False, False)


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_venv_without_vllm_fails_in_one_line_or_is_skipped_in_check_mode(tmp_path, run_module, check_mode):
    venv = tmp_path / "venv"
    (venv / "lib/python3.11/site-packages").mkdir(parents=True)
    args = {"venv": str(venv), "patches": PATCHES, "_ansible_check_mode": check_mode}
    result = run_module(patch_module, args)
    line = f"no vllm package in {venv} (no lib/python3*/site-packages/vllm)"
    assert result["msg"] == line
    assert result.get("failed", False) is not check_mode
    assert result.get("skipped", False) is check_mode
