"""After side_effect: 0.17.1 and 0.16.0 are both patched, their backups are the upstream bytes, the
rest of each package is untouched, and the server restart was notified once per change."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RELEASES = {"0.17.1": "/opt/vllm/venv", "0.16.0": "/opt/vllm-0.16/venv"}
PRISTINE = "/opt/vllm-pristine"
SITE = "lib/python3.11/site-packages"


def recorded(version):
    """{path: (upstream sha256, patched sha256)} from the patch's header in the role."""
    line = version.rsplit(".", 1)[0]
    text = (ROOT / f"roles/vllm_eagle3_patch/files/vllm-{line}.diff").read_text()
    hashes = {}
    for row in text.splitlines():
        if row.startswith("sha256:"):
            path, pre, post = row.split()[1:]
            hashes[path] = (pre, post)
    assert len(hashes) == 4
    return hashes


@pytest.mark.parametrize("version", RELEASES)
def test_targets_are_patched_and_backups_are_upstream_bytes(host, version):
    for path, (pre, post) in recorded(version).items():
        installed = f"{RELEASES[version]}/{SITE}/{path}"
        assert host.file(installed).sha256sum == post, path
        assert host.file(installed + ".specfleet-orig").sha256sum == pre, path
        assert host.file(f"{PRISTINE}/{version}/{path}").sha256sum == pre, path


@pytest.mark.parametrize("version", RELEASES)
def test_nothing_else_in_the_package_changed(host, version):
    venv = RELEASES[version]
    result = host.run(f"diff -rq --exclude=__pycache__ {PRISTINE}/{version}/vllm {venv}/{SITE}/vllm")
    lines = sorted(result.stdout.splitlines())
    differ = [line for line in lines if line.startswith("Files ")]
    only = [line for line in lines if line.startswith("Only in ")]
    assert len(differ) == 4 and len(only) == 4 and len(lines) == 8, lines
    assert all(line.endswith(".specfleet-orig") for line in only), only


@pytest.mark.parametrize("version", RELEASES)
def test_patched_files_are_byte_compiled_and_compile_on_the_box(host, version):
    venv = RELEASES[version]
    for path in recorded(version):
        source = Path(f"{venv}/{SITE}/{path}")
        pyc = host.file(f"{source.parent}/__pycache__/{source.stem}.cpython-311.pyc")
        assert pyc.exists and pyc.mtime >= host.file(str(source)).mtime, path
        host.run_test(f"{venv}/bin/python -m py_compile {source}")


@pytest.mark.parametrize("version", RELEASES)
def test_deepseek_v2_for_causal_lm_implements_supports_eagle3_on_the_box(host, version):
    text = host.file(f"{RELEASES[version]}/{SITE}/vllm/model_executor/models/deepseek_v2.py").content_string
    classes = {node.name: node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ClassDef)}
    model = classes["DeepseekV2ForCausalLM"]
    assert "SupportsEagle3" in {getattr(base, "id", None) for base in model.bases}
    methods = {node.name for node in model.body if isinstance(node, ast.FunctionDef)}
    assert {"set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers"} <= methods


def test_restart_was_notified_once_per_change(host):
    # converge, then side_effect: revert, re-apply (0.17.1); apply, revert, apply (0.16.0). The check
    # runs, the repeated runs and the refused run notified nothing.
    restarts = host.file("/var/lib/specfleet-molecule/restarts").content_string.split()
    assert restarts == [RELEASES["0.17.1"]] * 3 + [RELEASES["0.16.0"]] * 3
