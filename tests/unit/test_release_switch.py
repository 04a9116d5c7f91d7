"""release_switch: publish a staged release, move the served link in one rename, prune old releases."""

import json
import os

import pytest
import release_switch


@pytest.fixture
def root(tmp_path):
    (tmp_path / "releases").mkdir()
    return tmp_path


def stage(root, release, mtime=None, published=False):
    path = root / "releases" / (release if published else f"{release}.partial")
    path.mkdir()
    (path / "config.json").write_text("{}")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def switch(run_module, root, release, **extra):
    args = {
        "releases": str(root / "releases"),
        "release": release,
        "link": str(root / "current"),
        "previous": str(root / "previous"),
        "keep": 3,
        "record": {"id": release, "source": "/data/drafter"},
    }
    return run_module(release_switch, {**args, **extra})


def test_a_staged_release_is_published_with_its_record_and_served(root, run_module):
    stage(root, "aaa")
    result = switch(run_module, root, "aaa")
    release = root / "releases" / "aaa"
    assert result["changed"] is True and result["published"] is True
    assert (result["path"], result["replaced"], result["pruned"]) == (str(release), "", [])
    assert os.readlink(root / "current") == str(release)
    assert not (root / "releases" / "aaa.partial").exists()
    assert json.loads((release / ".release.json").read_text()) == {"id": "aaa", "source": "/data/drafter"}
    assert (release / ".release.json").stat().st_mode & 0o777 == 0o644
    assert not (root / "previous").exists()  # nothing was replaced
    assert sorted(p.name for p in release.iterdir()) == [".release.json", "config.json"]


def test_the_served_release_again_changes_nothing(root, run_module):
    stage(root, "aaa")
    switch(run_module, root, "aaa")
    again = switch(run_module, root, "aaa", record={"id": "aaa", "source": "elsewhere"})
    assert again["changed"] is False and again["published"] is False
    assert again["replaced"] == again["path"] == str(root / "releases" / "aaa")
    assert json.loads((root / "releases/aaa/.release.json").read_text())["source"] == "/data/drafter"


def test_a_new_release_keeps_the_replaced_one_as_previous_and_prunes_the_oldest(root, run_module):
    for age, release in enumerate(["old3", "old2", "old1"]):
        stage(root, release, mtime=1_000_000 + age, published=True)
    os.symlink(root / "releases" / "old3", root / "current")  # the oldest serves: it is never pruned
    stage(root, "other")  # another release's staged copy (other.partial): not one of the kept releases
    stage(root, "new")
    result = switch(run_module, root, "new")
    assert result["replaced"] == str(root / "releases" / "old3")
    assert os.readlink(root / "previous") == str(root / "releases" / "old3")
    assert os.readlink(root / "current") == str(root / "releases" / "new")
    # new, old1 and old2 are the three newest; old3 is beyond them, but current left it: kept. The staged
    # copy of another release goes as current moves.
    assert result["pruned"] == [str(root / "releases" / "other.partial")]
    stage(root, "newer")
    result = switch(run_module, root, "newer")
    assert result["pruned"] == [str(root / "releases" / "old2"), str(root / "releases" / "old3")]
    left = sorted(p.name for p in (root / "releases").iterdir())
    assert left == ["new", "newer", "old1"]
    assert os.readlink(root / "previous") == str(root / "releases" / "new")


def test_the_last_known_good_is_never_pruned(root, run_module):
    """A failed state kept for debugging (transaction_restore=false) serves a release the record does not
    name; ships after it must leave the recorded one for the restore (issue: the last good went after one
    further ship at keep 2)."""
    stage(root, "good", mtime=1_000_000, published=True)
    os.symlink(root / "releases" / "good", root / "current")
    protect = [str(root / "current-recorded")]
    os.symlink(root / "releases" / "good", protect[0])  # as the record names it: a path to resolve
    for age, release in enumerate(["failed", "next", "after"], start=1):
        stage(root, release)
        result = switch(run_module, root, release, keep=2, protect=protect)
        os.utime(root / "releases" / release, (1_000_000 + age,) * 2)
        assert str(root / "releases" / "good") not in result["pruned"]
    assert sorted(p.name for p in (root / "releases").iterdir()) == ["after", "good", "next"]


def test_check_mode_writes_nothing_and_says_what_would_happen(root, run_module):
    stage(root, "aaa", published=True)
    os.symlink(root / "releases" / "aaa", root / "current")
    before = sorted(str(p) for p in root.rglob("*"))
    result = switch(run_module, root, "bbb", _ansible_check_mode=True, _ansible_diff=True)
    assert result["changed"] is True and result["published"] is True  # not staged in check mode
    assert result["diff"] == {
        "before": f"{root}/current -> {root}/releases/aaa\n",
        "after": f"{root}/current -> {root}/releases/bbb\n",
    }
    assert sorted(str(p) for p in root.rglob("*")) == before
    assert os.readlink(root / "current") == str(root / "releases" / "aaa")


def test_a_release_neither_published_nor_staged_fails_in_one_line(root, run_module):
    stage(root, "aaa", published=True)
    os.symlink(root / "releases" / "aaa", root / "current")
    result = switch(run_module, root, "missing")
    assert result["failed"] is True
    assert result["msg"] == f"release missing is neither published nor staged in {root}/releases"
    assert os.readlink(root / "current") == str(root / "releases" / "aaa")


@pytest.mark.parametrize("release", ["", "../etc", ".hidden"])
def test_a_release_id_that_is_no_directory_name_is_refused(root, run_module, release):
    result = switch(run_module, root, release)
    assert result["failed"] is True and "is not a release id" in result["msg"]


def test_something_other_than_a_link_at_the_served_path_is_left_alone(root, run_module):
    stage(root, "aaa")
    (root / "current").mkdir()
    (root / "current" / "weights.bin").write_text("real weights")
    result = switch(run_module, root, "aaa")
    assert result["failed"] is True
    said = f"{root}/current is not a link: move it aside so that releases can be served through it"
    assert result["msg"] == said
    assert (root / "current" / "weights.bin").read_text() == "real weights"
    assert (root / "releases" / "aaa.partial").is_dir()


def test_staged_copies_of_other_releases_are_pruned_when_the_link_moves(root, run_module):
    """A transfer abandoned halfway leaves <id>.partial (hundreds of GB of weights): the next switch removes
    it, and every other release's staged copy; the staged copy of the release switched to is published."""
    stage(root, "aaa", published=True)
    os.symlink(root / "releases" / "aaa", root / "current")
    for abandoned in ("half", "older"):
        (stage(root, abandoned) / "model-00001-of-00064.safetensors").write_bytes(b"\0" * 1024)
    stage(root, "new")
    partials = [str(root / "releases" / f"{name}.partial") for name in ("half", "older")]
    checked = switch(run_module, root, "new", _ansible_check_mode=True)
    assert checked["pruned"] == partials and all(os.path.isdir(path) for path in partials)
    result = switch(run_module, root, "new")
    assert result["published"] is True and result["pruned"] == partials
    assert sorted(p.name for p in (root / "releases").iterdir()) == ["aaa", "new"]
    # Where the link does not move, nothing is pruned: a staged copy of a transfer under way stays.
    stage(root, "next")
    again = switch(run_module, root, "new")
    assert again["changed"] is False and again["pruned"] == []
    assert (root / "releases" / "next.partial").is_dir()
