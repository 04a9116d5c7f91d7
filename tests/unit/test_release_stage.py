"""release_stage: a published release costs one look; a new one gets its releases directory and where rsync
is."""

import json
import os
import shutil

import release_stage


def look(run_module, releases, release="aaa", check=False):
    args = {"releases": str(releases), "release": release}
    if check:
        args["_ansible_check_mode"] = True
    return run_module(release_stage, args)


def test_a_published_release_needs_nothing(tmp_path, run_module):
    published = tmp_path / "releases" / "aaa"
    published.mkdir(parents=True)
    (published / ".release.json").write_text(json.dumps({"id": "aaa"}))
    result = look(run_module, tmp_path / "releases")
    assert (result["changed"], result["published"], result["serves"], result["rsync"]) == (
        False,
        True,
        False,
        None,
    )


def test_it_says_whether_the_link_serves_the_release(tmp_path, run_module):
    for release in ("aaa", "bbb"):
        (tmp_path / "releases" / release).mkdir(parents=True)
        (tmp_path / "releases" / release / ".release.json").write_text("{}")
    link = tmp_path / "current"
    link.symlink_to(tmp_path / "releases" / "aaa")
    args = {"releases": str(tmp_path / "releases"), "link": str(link)}
    assert run_module(release_stage, {**args, "release": "aaa"})["serves"] is True
    assert run_module(release_stage, {**args, "release": "bbb"})["serves"] is False
    # A served path that is a directory, not a link, serves no release (release_switch refuses it).
    assert (
        run_module(release_stage, {**args, "release": "aaa", "link": str(tmp_path / "releases")})["serves"]
        is False
    )


def test_a_staged_copy_is_not_published(tmp_path, run_module):
    (tmp_path / "releases" / "aaa.partial").mkdir(parents=True)
    (tmp_path / "releases" / "aaa").mkdir()  # a directory without its record is not a release
    result = look(run_module, tmp_path / "releases")
    assert (result["changed"], result["published"]) == (False, False)
    assert result["rsync"] == shutil.which("rsync")


def test_a_missing_releases_directory_is_created_for_root(tmp_path, run_module):
    os.umask(0o077)
    try:
        result = look(run_module, tmp_path / "srv" / "releases")
    finally:
        os.umask(0o022)
    releases = tmp_path / "srv" / "releases"
    assert (result["changed"], result["published"]) == (True, False)
    assert releases.stat().st_mode & 0o777 == 0o755
    assert (releases.stat().st_uid, releases.stat().st_gid) == (0, 0)


def test_check_mode_creates_nothing(tmp_path, run_module):
    result = look(run_module, tmp_path / "releases", check=True)
    assert (result["changed"], result["published"]) == (True, False)
    assert not (tmp_path / "releases").exists()
