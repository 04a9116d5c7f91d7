"""last_good: the record of what served after a pass, and putting it back after a failed change."""

import json
import os
import stat

import last_good
import pytest


@pytest.fixture
def box(tmp_path):
    """A unit file, a root-only environment file and a drafter `current` link, as a deploy leaves them."""
    releases = tmp_path / "drafters" / "releases"
    for release in ("good", "new"):
        (releases / release).mkdir(parents=True)
    (tmp_path / "drafters" / "current").symlink_to(releases / "good")
    unit = tmp_path / "vllm.service"
    unit.write_text("[Service]\nExecStart=/opt/vllm/bin/vllm serve /models/m\n")
    unit.chmod(0o644)
    env = tmp_path / "vllm.env"
    env.write_text("VLLM_API_KEY=secret-key\n")
    env.chmod(0o600)
    return tmp_path


def args(box, state, **extra):
    return {
        "state": state,
        "dir": str(box / "last_good"),
        "files": {"unit": str(box / "vllm.service"), "environment": str(box / "vllm.env")},
        "links": {"drafter": str(box / "drafters" / "current")},
        "serving": {"vllm_version": "0.33.0", "speculative_config": {"num_speculative_tokens": 3}},
        **extra,
    }


def break_the_box(box):
    """What a failed change leaves: another unit, no API key, the drafter link on a new release."""
    (box / "vllm.service").write_text(
        "[Service]\nExecStart=/opt/vllm/bin/vllm serve /models/m --bogus-flag\n"
    )
    (box / "vllm.env").unlink()
    current = box / "drafters" / "current"
    current.unlink()
    current.symlink_to(box / "drafters" / "releases" / "new")


def test_a_box_without_a_record_reads_as_not_recorded(box, run_module):
    result = run_module(last_good, args(box, "read"))
    assert result["ansible_facts"]["last_good"] == {"recorded": False}
    assert result["changed"] is False and result["changes"] == []
    restore = run_module(last_good, args(box, "restored"))
    assert restore["restored"] == [] and restore["changed"] is False
    assert not (box / "last_good").exists()


def test_record_keeps_root_only_copies_and_returns_no_secret(box, run_module, capsys):
    result = run_module(last_good, args(box, "recorded", details={"acceptance_rate": 0.8}))
    assert result["changed"] is True
    record = result["ansible_facts"]["last_good"]
    assert record["recorded"] is True
    assert record["files"] == {"environment": "present", "unit": "present"}
    assert record["links"] == {"drafter": str(box / "drafters" / "releases" / "good")}
    assert record["serving"]["vllm_version"] == "0.33.0"
    assert record["details"] == {"acceptance_rate": 0.8}
    assert "secret-key" not in json.dumps(result)
    kept = box / "last_good"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700
    for path in [kept / "record.json", *(kept / "files").iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert (kept / "files" / "environment").read_text() == "VLLM_API_KEY=secret-key\n"


def test_the_same_configuration_passing_again_changes_nothing(box, run_module):
    first = run_module(last_good, args(box, "recorded", details={"acceptance_rate": 0.8}))
    again = run_module(last_good, args(box, "recorded", details={"acceptance_rate": 0.7}))
    assert again["changed"] is False and again["changes"] == []
    # The record still says when and with which details this configuration first passed.
    assert again["ansible_facts"] == first["ansible_facts"]


def test_a_new_configuration_that_passes_replaces_the_record(box, run_module):
    run_module(last_good, args(box, "recorded"))
    (box / "vllm.service").write_text("[Service]\nExecStart=/opt/vllm/bin/vllm serve /models/m --new\n")
    newer = args(box, "recorded", serving={"vllm_version": "0.34.0", "speculative_config": {}})
    result = run_module(last_good, newer)
    assert result["changed"] is True
    assert result["changes"] == [
        "unit file",
        "speculative_config {} (last good: {'num_speculative_tokens': 3})",
        "vllm_version 0.34.0 (last good: 0.33.0)",
    ]
    assert result["ansible_facts"]["last_good"]["serving"]["vllm_version"] == "0.34.0"
    assert (box / "last_good" / "files" / "unit").read_text().endswith("--new\n")


def test_restore_puts_back_files_modes_and_the_link(box, run_module):
    run_module(last_good, args(box, "recorded"))
    good_unit = (box / "vllm.service").read_text()
    break_the_box(box)
    result = run_module(
        last_good, args(box, "restored", serving={"vllm_version": "0.34.0", "speculative_config": {}})
    )
    assert result["changed"] is True
    good = str(box / "drafters" / "releases" / "good")
    assert result["restored"] == ["environment file", "unit file", f"drafter link -> {good}"]
    assert result["not_restored"] == [
        "speculative_config {} (last good: {'num_speculative_tokens': 3})",
        "vllm_version 0.34.0 (last good: 0.33.0)",
    ]
    assert (box / "vllm.service").read_text() == good_unit
    assert stat.S_IMODE((box / "vllm.service").stat().st_mode) == 0o644
    assert (box / "vllm.env").read_text() == "VLLM_API_KEY=secret-key\n"
    assert stat.S_IMODE((box / "vllm.env").stat().st_mode) == 0o600
    assert os.readlink(box / "drafters" / "current") == good
    again = run_module(last_good, args(box, "restored"))
    assert again["changed"] is False and again["restored"] == []


def test_restore_in_check_mode_says_what_it_would_put_back_and_touches_nothing(box, run_module):
    run_module(last_good, args(box, "recorded"))
    break_the_box(box)
    broken_unit = (box / "vllm.service").read_text()
    result = run_module(last_good, args(box, "restored", _ansible_check_mode=True))
    assert result["changed"] is True
    assert result["restored"][:2] == ["environment file", "unit file"]
    assert (box / "vllm.service").read_text() == broken_unit
    assert not (box / "vllm.env").exists()
    assert os.readlink(box / "drafters" / "current").endswith("/new")


def test_a_file_absent_in_the_record_is_removed_again(box, run_module):
    (box / "vllm.env").unlink()
    run_module(last_good, args(box, "recorded"))
    (box / "vllm.env").write_text("VLLM_API_KEY=added-by-the-failed-run\n")
    result = run_module(last_good, args(box, "restored"))
    assert result["restored"] == ["environment file"]
    assert not (box / "vllm.env").exists()


def test_a_recorded_release_that_is_gone_fails_with_one_line(box, run_module):
    run_module(last_good, args(box, "recorded"))
    break_the_box(box)
    (box / "drafters" / "releases" / "good").rmdir()
    result = run_module(last_good, args(box, "restored"))
    assert result["failed"] is True
    assert result["msg"] == (
        f"the last known good drafter {box}/drafters/releases/good is gone: "
        f"cannot point {box}/drafters/current back at it"
    )


def test_a_tampered_copy_is_not_put_back(box, run_module):
    run_module(last_good, args(box, "recorded"))
    break_the_box(box)
    (box / "last_good" / "files" / "unit").write_text("[Service]\nExecStart=/bin/false\n")
    result = run_module(last_good, args(box, "restored"))
    assert result["failed"] is True and "does not match its record" in result["msg"]
    assert "--bogus-flag" in (box / "vllm.service").read_text()


def test_an_unreadable_record_fails_with_one_line(box, run_module):
    (box / "last_good").mkdir()
    (box / "last_good" / "record.json").write_text("{not json")
    result = run_module(last_good, args(box, "read"))
    assert result["failed"] is True
    assert result["msg"].startswith(f"cannot read the last known good record in {box}/last_good: ")


def test_each_new_record_keeps_the_best_figures_per_workload(box, run_module):
    """The gate compares a change with the best ever recorded for its workload, not the latest: a run of
    changes each within the margin cannot add up to a large drop."""
    first = args(box, "recorded", measured={"key": "w1", "figures": {"mean_acceptance_length": 3.4}})
    best = run_module(last_good, first)["ansible_facts"]["last_good"]["best"]
    assert best["w1"]["mean_acceptance_length"] == 3.4
    at = best["w1"]["mean_acceptance_length_at"]
    (box / "vllm.service").write_text("[Service]\nExecStart=/opt/vllm/bin/vllm serve /models/m --second\n")
    lower = args(
        box,
        "recorded",
        measured={"key": "w1", "figures": {"mean_acceptance_length": 3.2, "tokens_per_second": 9}},
    )
    best = run_module(last_good, lower)["ansible_facts"]["last_good"]["best"]
    assert best["w1"]["mean_acceptance_length"] == 3.4 and best["w1"]["mean_acceptance_length_at"] == at
    assert best["w1"]["tokens_per_second"] == 9
    (box / "vllm.service").write_text("[Service]\nExecStart=/opt/vllm/bin/vllm serve /models/m --third\n")
    other = args(box, "recorded", measured={"key": "w2", "figures": {"mean_acceptance_length": 2.5}})
    best = run_module(last_good, other)["ansible_facts"]["last_good"]["best"]
    assert sorted(best) == ["w1", "w2"] and best["w1"]["mean_acceptance_length"] == 3.4
    # Read back as the next run's begin sees it.
    assert run_module(last_good, args(box, "read"))["ansible_facts"]["last_good"]["best"] == best


def test_reading_the_record_takes_no_lock(box, run_module):
    """The record is read without the deploy lock (deploy_lock's, which roles/transaction takes first):
    a read by the fleet report next to a running deploy neither waits for nor leaves a lock."""
    run_module(last_good, args(box, "recorded"))
    lock = box / "deploy.lock"
    lock.write_text(
        json.dumps({"holder": "alice@ops", "token": "run-1", "since": "2026-12-06T00:00:00+00:00"})
    )
    read = run_module(last_good, args(box, "read"))
    assert read["changed"] is False and read["ansible_facts"]["last_good"]["recorded"] is True
    assert json.loads(lock.read_text())["token"] == "run-1"
    refused = run_module(last_good, args(box, "read", lock={"path": str(lock), "token": "run-2"}))
    assert refused["failed"] is True and "lock" in refused["msg"]


def test_a_change_of_the_proxy_alone_merges_into_the_record(box, run_module):
    """--tags vllm_proxy (a new key): the site is recorded anew, and the server behind it stays as judged -
    its unit, environment and links as recorded, its details and best figures kept."""
    site = box / "site.conf"
    site.write_text('map $http_authorization $authorized { "~^(?i:Bearer) +old-key$" 1; }\n')
    site.chmod(0o600)
    whole = args(box, "recorded", details={"gate": {"mean_acceptance_length": 3.37}})
    whole["files"]["proxy"] = str(site)
    measured = {"key": "w", "figures": {"mean_acceptance_length": 3.37}}
    run_module(last_good, {**whole, "measured": measured})
    # The key changes; meanwhile the unit on disk differs too (a run that did not confirm it): not recorded.
    site.write_text('map $http_authorization $authorized { "~^(?i:Bearer) +new-key$" 1; }\n')
    (box / "vllm.service").write_text("[Service]\nExecStart=/opt/vllm/bin/vllm serve /models/other\n")
    merged = run_module(
        last_good, {**args(box, "recorded"), "files": {"proxy": str(site)}, "links": {}, "merge": True}
    )
    assert merged["changed"] is True
    record = merged["ansible_facts"]["last_good"]
    assert record["details"] == {"gate": {"mean_acceptance_length": 3.37}}
    assert record["best"]["w"]["mean_acceptance_length"] == 3.37
    assert record["links"] == {"drafter": str(box / "drafters" / "releases" / "good")}
    kept = box / "last_good" / "files"
    assert "new-key" in (kept / "proxy").read_text()
    assert "/models/m\n" in (kept / "unit").read_text()
    # A failed change later puts back the new site and the recorded unit.
    site.write_text("broken\n")
    restore = run_module(last_good, {**whole, "state": "restored"})
    assert restore["restored"] == ["proxy file", "unit file"]
    assert "new-key" in site.read_text()
    assert stat.S_IMODE(site.stat().st_mode) == 0o600
    assert "/models/m\n" in (box / "vllm.service").read_text()


def test_a_merge_on_a_box_without_a_record_records_nothing(box, run_module):
    site = box / "site.conf"
    site.write_text("server {}\n")
    merged = run_module(
        last_good, {**args(box, "recorded"), "files": {"proxy": str(site)}, "links": {}, "merge": True}
    )
    assert merged["changed"] is False
    assert merged["ansible_facts"]["last_good"] == {"recorded": False}
    assert not (box / "last_good").exists()
