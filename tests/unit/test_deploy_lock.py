"""deploy_lock: one deploy at a time per box, a second run told who holds it, stale locks taken over."""

import datetime
import json
import os
import threading
import time

import deploy_lock
import pytest
from ansible.module_utils import deploy_lock as lock_file


@pytest.fixture
def lock(tmp_path):
    return tmp_path / "specfleet" / "deploy.lock"


def hold(run_module, lock, token, holder="alice@ops", **extra):
    return run_module(deploy_lock, {"path": str(lock), "token": token, "holder": holder, **extra})


def test_a_free_box_is_locked_for_this_run_and_released_after(lock, run_module):
    result = hold(run_module, lock, "run-1")
    assert result["changed"] is False and result["taken_over"] is None
    kept = json.loads(lock.read_text())
    assert (kept["holder"], kept["token"]) == ("alice@ops", "run-1")
    assert datetime.datetime.fromisoformat(kept["since"]).tzinfo is not None
    again = hold(run_module, lock, "run-1")  # the same run again (a second entry point)
    assert again["lock"] == kept
    released = run_module(deploy_lock, {"path": str(lock), "token": "run-1", "state": "released"})
    assert released["lock"] is None and not lock.exists()
    assert [p.name for p in lock.parent.iterdir()] == []  # no temporary file left


def test_a_second_run_is_refused_with_who_holds_it(lock, run_module):
    hold(run_module, lock, "run-1")
    refused = hold(run_module, lock, "run-2", holder="bob@laptop")
    assert refused["failed"] is True
    assert refused["msg"].startswith("another deploy holds this box: alice@ops since ")
    assert f"remove {lock} once that run is gone" in refused["msg"]
    assert "\n" not in refused["msg"]
    assert json.loads(lock.read_text())["token"] == "run-1"


def test_a_run_releases_only_its_own_lock(lock, run_module):
    hold(run_module, lock, "run-1")
    other = run_module(deploy_lock, {"path": str(lock), "token": "run-2", "state": "released"})
    assert other["lock"]["token"] == "run-1" and lock.exists()


def test_a_stale_lock_is_taken_over_and_named(lock, run_module):
    lock.parent.mkdir(parents=True)
    since = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=7)).isoformat()
    lock.write_text(json.dumps({"holder": "carol@gone", "token": "killed-run", "since": since}))
    result = hold(run_module, lock, "run-2", holder="bob@laptop")
    assert result["taken_over"] == {"holder": "carol@gone", "since": since}
    assert json.loads(lock.read_text())["holder"] == "bob@laptop"


def test_an_unreadable_lock_ages_by_its_mtime(lock, run_module):
    lock.parent.mkdir(parents=True)
    lock.write_text("{half a lo")
    refused = hold(run_module, lock, "run-2")
    assert refused["failed"] is True and "unknown since ?" in refused["msg"]
    old = lock.stat().st_mtime - 8 * 3600
    os.utime(lock, (old, old))
    assert hold(run_module, lock, "run-2")["taken_over"] == {"holder": None, "since": None}


def test_check_mode_writes_nothing_but_still_refuses(lock, run_module):
    checked = hold(run_module, lock, "run-1", _ansible_check_mode=True)
    assert checked["lock"]["token"] == "run-1" and not lock.exists()
    hold(run_module, lock, "run-1")
    refused = hold(run_module, lock, "run-2", _ansible_check_mode=True)
    assert refused["failed"] is True


def test_two_runs_racing_for_a_stale_lock_take_it_once(lock, monkeypatch):
    """Both find the same stale lock; judging its age takes a moment (widened here, as on a loaded box):
    exactly one run takes it over, the other is refused, and the lock on disk is the winner's."""
    lock.parent.mkdir(parents=True)
    since = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=7)).isoformat()
    lock.write_text(json.dumps({"holder": "carol@gone", "token": "killed-run", "since": since}))
    judged = lock_file.age_s

    def slow_age(*args):
        time.sleep(0.2)
        return judged(*args)

    monkeypatch.setattr(lock_file, "age_s", slow_age)
    outcomes = {}

    def take(token):
        try:
            lock_file.hold(Module(), str(lock), f"{token}@ops", token, 21600)
            outcomes[token] = "held"
        except Refused as refused:
            outcomes[token] = str(refused)

    runs = [threading.Thread(target=take, args=(token,)) for token in ("run-a", "run-b")]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    held = [token for token, outcome in outcomes.items() if outcome == "held"]
    assert len(held) == 1, outcomes
    assert json.loads(lock.read_text())["token"] == held[0]
    [refused] = [outcome for outcome in outcomes.values() if outcome != "held"]
    assert refused.startswith(f"another deploy holds this box: {held[0]}@ops since "), refused


class Refused(Exception):
    pass


class Module:
    """What module_utils/deploy_lock needs of AnsibleModule: fail_json (here an exception) and check_mode."""

    check_mode = False

    def fail_json(self, msg, **_):
        raise Refused(msg)


def test_the_directories_the_lock_makes_are_world_readable_whatever_the_umask(tmp_path, run_module):
    """The lock is the first file a deploy writes under /var/lib/specfleet: under umask 027 the directory
    was 0750, and nginx's workers could not reach the box's timed loads beside it (/specfleet/loads)."""
    lock = tmp_path / "var" / "specfleet" / "deploy.lock"
    previous = os.umask(0o027)
    try:
        hold(run_module, lock, "run-1")
    finally:
        os.umask(previous)
    assert {d.name: oct(d.stat().st_mode & 0o777) for d in (lock.parent, lock.parent.parent)} == {
        "specfleet": "0o755",
        "var": "0o755",
    }
