"""controller_file (action_plugins/controller_file.py), run by ansible-playbook as a play runs it: it
writes on the controller in the worker itself, leaves an equal file alone, writes nothing in check mode,
and says in one line why it could not write."""

import json
import stat

import pytest
from driver import run_playbook


def write(tmp_path, dest, content, *args, mode=None):
    playbook = tmp_path / "write.yml"
    task = {"controller_file": {"dest": str(dest), "content": content, **({"mode": mode} if mode else {})}}
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}]))
    run = run_playbook(playbook, *args, inventory="localhost,")
    return run, run.one(host="localhost", action="controller_file")


def test_writes_the_file_and_its_directory_then_leaves_it(tmp_path):
    dest = tmp_path / "reports" / "box.json"
    run, result = write(tmp_path, dest, '{"passed": true}\n')
    assert run.ok and result.changed and result.result["dest"] == str(dest), str(run)
    assert dest.read_text() == '{"passed": true}\n'
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644
    assert stat.S_IMODE(dest.parent.stat().st_mode) == 0o755
    assert [path.name for path in dest.parent.iterdir()] == ["box.json"]  # no staging file left

    written = dest.stat().st_mtime_ns
    run, result = write(tmp_path, dest, '{"passed": true}\n')
    assert run.ok and not result.changed, str(run)
    assert dest.stat().st_mtime_ns == written

    run, result = write(tmp_path, dest, '{"passed": true}\n', mode="0600")
    assert run.ok and result.changed and stat.S_IMODE(dest.stat().st_mode) == 0o600, str(run)


def test_check_mode_writes_nothing(tmp_path):
    dest = tmp_path / "box.json"
    run, result = write(tmp_path, dest, "new\n", "--check")
    assert run.ok and result.changed and not dest.exists(), str(run)
    dest.write_text("old\n")
    dest.chmod(0o644)
    run, result = write(tmp_path, dest, "new\n", "--check")
    assert run.ok and result.changed and dest.read_text() == "old\n", str(run)


@pytest.mark.parametrize(
    "where, mode, line",
    [
        ("file/box.json", None, "{dest}: cannot be written: Not a directory"),
        ("box.json", "rw-r--r--", "mode='rw-r--r--' is not an octal mode such as 0644"),
    ],
)
def test_a_file_it_cannot_write_fails_with_one_line(tmp_path, where, mode, line):
    (tmp_path / "file").write_text("a file where a directory should be\n")
    dest = tmp_path / where
    run, result = write(tmp_path, dest, "x\n", mode=mode)
    assert not run.ok and run.failures() == [line.format(dest=dest)], str(run)
    assert not dest.exists()
