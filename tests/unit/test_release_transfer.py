"""release_transfer (action_plugins/release_transfer.py): synchronize's real rsync, its progress counted
from rsync's own log while it runs - files and bytes written by each line's time - and the copy whole at
the end; a dry run (check mode) counts nothing and writes nothing."""

import json
import os
import sys

import pytest
from driver import run_playbook

FILES = 4
SIZE = 150 * 1024
# rsync's own limit, KiB/s: the four files take about four seconds, long enough for a line each second.
SLOW = "--bwlimit=150"


def play(tmp_path, options, *args):
    """release_transfer of FILES shards of SIZE into dest/, with these options; the run, source and dest."""
    source, dest = tmp_path / "source", tmp_path / "dest"
    source.mkdir(exist_ok=True)
    for i in range(FILES):
        (source / f"shard-{i}.bin").write_bytes(os.urandom(SIZE))
    inventory = tmp_path / "inventory.json"
    box = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"all": {"hosts": {"box": box}}}))
    playbook = tmp_path / "transfer.yml"
    task = {
        "release_transfer": {
            "src": f"{source}/",
            "dest": f"{dest}/",
            "archive": False,
            "recursive": True,
            "total_bytes": FILES * SIZE,
            "progress_interval_s": 1,
            "rsync_opts": [SLOW],
            **options,
        }
    }
    playbook.write_text(json.dumps([{"hosts": "box", "gather_facts": False, "tasks": [task]}]))
    return run_playbook(playbook, *args, inventory=inventory), source, dest


def transfer(tmp_path, *args, **options):
    run, source, dest = play(tmp_path, options, *args)
    assert run.ok, str(run)
    return run.one(host="box", action="release_transfer").result, source, dest


def test_progress_is_counted_while_rsync_runs(tmp_path):
    result, source, dest = transfer(tmp_path)
    progress = result["progress"]
    # Lines came while files were still on their way, each further on than the one before.
    during = progress[:-1]
    assert during and during[0]["bytes"] < FILES * SIZE, progress
    assert all(a["bytes"] < b["bytes"] for a, b in zip(during, during[1:])), progress
    assert all(a["seconds"] < b["seconds"] for a, b in zip(progress, progress[1:])), progress
    assert progress[-1]["files"] == FILES and progress[-1]["bytes"] == FILES * SIZE, progress
    assert result["transferred"].startswith("box: 4 file(s), 600.00 KB of 600.00 KB (100%) in "), result
    assert result["changed"] and SLOW in result["cmd"], result
    for path in source.iterdir():
        assert (dest / path.name).read_bytes() == path.read_bytes()


@pytest.mark.parametrize("args", [("--check",)])
def test_a_dry_run_counts_and_writes_nothing(tmp_path, args):
    result, _, dest = transfer(tmp_path, *args)
    assert [entry["files"] for entry in result["progress"]] == [0] * len(result["progress"]), result
    assert not dest.exists() or not any(dest.iterdir())


def test_a_linked_shard_is_sent_as_the_file_it_points_at(tmp_path):
    """copy_links (roles/release_sync sets it) passes through to rsync: a Hugging Face snapshot's link into
    its blobs/ arrives as a regular file, as the controller's manifest described it."""
    blob = tmp_path / "blobs" / "0a1b2c"
    blob.parent.mkdir()
    blob.write_bytes(os.urandom(SIZE))
    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "linked.safetensors").symlink_to("../blobs/0a1b2c")
    result, _, dest = transfer(tmp_path, copy_links=True, rsync_opts=[])
    assert "--copy-links" in result["cmd"], result
    shipped = dest / "linked.safetensors"
    assert not shipped.is_symlink() and shipped.read_bytes() == blob.read_bytes()


@pytest.mark.parametrize("interval", [0, -5, "0.5"])
def test_an_interval_under_a_second_fails_before_any_transfer(tmp_path, interval):
    """The reporter waits interval seconds between lines: at 0 or below it would spin through the whole
    transfer."""
    run, _, dest = play(tmp_path, {"progress_interval_s": interval, "rsync_opts": []})
    assert not run.ok
    said = f"release_transfer: progress_interval_s={interval} is not a number of seconds of at least 1"
    assert run.failures("box") == [said], str(run)
    assert not dest.exists()
