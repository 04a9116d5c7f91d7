"""content_file: a file from given content in one call to the box, written only where it differs."""

import os
import stat

import content_file

UNIT = "[Service]\nExecStart=/bin/true\n"


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_file_and_its_directory_are_made_with_their_modes(tmp_path, run_module):
    env = tmp_path / "vllm" / "vllm.env"
    result = run_module(content_file, {"path": str(env), "content": "VLLM_API_KEY=k\n", "mode": "0600"})
    assert result["changed"] is True and env.read_text() == "VLLM_API_KEY=k\n"
    assert (mode(env), mode(env.parent)) == (0o600, 0o755)
    assert [p.name for p in env.parent.iterdir()] == ["vllm.env"]  # no temporary file left


def test_the_same_content_again_changes_nothing(tmp_path, run_module):
    unit = tmp_path / "vllm.service"
    run_module(content_file, {"path": str(unit), "content": UNIT})
    again = run_module(content_file, {"path": str(unit), "content": UNIT, "_ansible_diff": True})
    assert again["changed"] is False and "diff" not in again


def test_other_content_is_written_and_diffed_and_a_loosened_mode_put_back(tmp_path, run_module):
    unit = tmp_path / "vllm.service"
    run_module(content_file, {"path": str(unit), "content": UNIT})
    unit.chmod(0o666)
    new = UNIT.replace("true", "false")
    result = run_module(content_file, {"path": str(unit), "content": new, "_ansible_diff": True})
    assert result["changed"] is True and unit.read_text() == new and mode(unit) == 0o644
    assert (result["diff"]["before"], result["diff"]["after"]) == (UNIT, new)
    unit.chmod(0o600)
    assert run_module(content_file, {"path": str(unit), "content": new})["changed"] is True
    assert mode(unit) == 0o644


def test_check_mode_writes_nothing(tmp_path, run_module):
    unit = tmp_path / "systemd" / "vllm.service"
    result = run_module(content_file, {"path": str(unit), "content": UNIT, "_ansible_check_mode": True})
    assert result["changed"] is True and list(tmp_path.iterdir()) == []


def test_an_absent_file_is_removed_once(tmp_path, run_module):
    env = tmp_path / "vllm.env"
    env.write_text("VLLM_API_KEY=k\n")
    gone = {"path": str(env), "state": "absent"}
    assert run_module(content_file, gone)["changed"] is True and not env.exists()
    assert run_module(content_file, gone)["changed"] is False


def test_present_needs_content(tmp_path, run_module):
    result = run_module(content_file, {"path": str(tmp_path / "f")})
    assert (
        result["failed"] is True
        and "state is present but all of the following are missing: content" in result["msg"]
    )
    assert not (tmp_path / "f").exists()
