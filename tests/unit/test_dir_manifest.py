"""dir_manifest: content digest of a directory, re-hashing only what changed."""

import hashlib
import json
import os
import shutil

import dir_manifest as dm
from ansible.module_utils import content_manifest as cm
from driver import run_playbook


def make_checkpoint(root):
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"hidden_size": 128}')
    (root / "model.safetensors").write_bytes(os.urandom(4096))
    (root / "sub").mkdir(exist_ok=True)
    (root / "sub" / "extra.txt").write_text("x")
    return root


def test_manifest_lists_files_with_real_sha256(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    manifest, _ = cm.build_manifest(str(root))
    assert [f["name"] for f in manifest["files"]] == ["config.json", "model.safetensors", "sub/extra.txt"]
    weights = next(f for f in manifest["files"] if f["name"] == "model.safetensors")
    assert weights["sha256"] == hashlib.sha256((root / "model.safetensors").read_bytes()).hexdigest()
    assert weights["size"] == 4096
    assert manifest["total_bytes"] == sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    assert sorted(manifest["hashed"]) == ["config.json", "model.safetensors", "sub/extra.txt"]


def test_digest_depends_on_content_not_location_or_mtime(tmp_path):
    first = make_checkpoint(tmp_path / "a")
    second = tmp_path / "b"
    shutil.copytree(first, second)
    os.utime(second / "config.json", (1, 1))
    digest_a = cm.build_manifest(str(first))[0]["digest"]
    assert cm.build_manifest(str(second))[0]["digest"] == digest_a
    (second / "config.json").write_text('{"hidden_size": 256}')
    assert cm.build_manifest(str(second))[0]["digest"] != digest_a


def test_cache_skips_unchanged_files_and_rehashes_changed_ones(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    first, cache = cm.build_manifest(str(root))
    second, cache = cm.build_manifest(str(root), cache)
    assert second["hashed"] == []
    assert second["digest"] == first["digest"]
    (root / "model.safetensors").write_bytes(os.urandom(4096))
    third, _ = cm.build_manifest(str(root), cache)
    assert third["hashed"] == ["model.safetensors"]
    assert third["digest"] != first["digest"]


def test_cache_with_a_stale_size_is_not_trusted(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    _, cache = cm.build_manifest(str(root))
    cache["config.json"]["size"] += 1
    manifest, _ = cm.build_manifest(str(root), cache)
    assert manifest["hashed"] == ["config.json"]


def test_exclude_left_out(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    manifest, _ = cm.build_manifest(str(root), exclude=["sub/extra.txt"])
    assert [f["name"] for f in manifest["files"]] == ["config.json", "model.safetensors"]


def hugging_face_snapshot(tmp_path):
    """A Hugging Face cache snapshot: each file a relative link into blobs/, named by its content."""
    source = make_checkpoint(tmp_path / "source")
    blobs, snapshot = tmp_path / "hub/blobs", tmp_path / "hub/snapshots/0a1b2c"
    blobs.mkdir(parents=True)
    (snapshot / "sub").mkdir(parents=True)
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        blob = blobs / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        name = path.relative_to(source)
        (snapshot / name).symlink_to(os.path.relpath(blob, (snapshot / name).parent))
    return source, snapshot


def test_a_link_to_a_file_is_described_by_what_it_points_at(tmp_path, run_module):
    """Shipped with rsync's --copy-links, the link becomes the file it points at: the box's staged copy
    (where it is a regular file) gives the same manifest, and so the same digest."""
    source, snapshot = hugging_face_snapshot(tmp_path)
    linked, _ = cm.build_manifest(str(snapshot))
    copied, _ = cm.build_manifest(str(source))
    assert [f["name"] for f in linked["files"]] == ["config.json", "model.safetensors", "sub/extra.txt"]
    weights = next(f for f in linked["files"] if f["name"] == "model.safetensors")
    assert weights["sha256"] == hashlib.sha256((source / "model.safetensors").read_bytes()).hexdigest()
    assert (weights["size"], linked["total_bytes"]) == (4096, copied["total_bytes"])
    assert linked["digest"] == copied["digest"]
    staged = tmp_path / "staged"
    shutil.copytree(snapshot, staged)  # links followed, as rsync --copy-links does
    assert not any(path.is_symlink() for path in staged.rglob("*"))
    assert run_module(dm, {"path": str(staged), "compare": linked["files"]})["differs"] == []


def test_a_dangling_link_or_a_link_to_a_directory_fails_in_one_line(tmp_path, run_module):
    root = make_checkpoint(tmp_path / "ckpt")
    (root / "gone.safetensors").symlink_to("../blobs/0123")
    result = run_module(dm, {"path": str(root)})
    assert result["failed"] is True
    assert result["msg"] == f"{root}/gone.safetensors is a dangling link: ../blobs/0123 does not exist"
    # On the controller (its action, in the worker), the same line.
    run, _ = describe_on_the_controller(tmp_path, {"path": str(root)})
    assert run.failures() == [result["msg"]], str(run)
    (root / "gone.safetensors").unlink()
    (tmp_path / "tokenizer").mkdir()
    (root / "tokenizer").symlink_to(tmp_path / "tokenizer")
    result = run_module(dm, {"path": str(root)})
    assert result["failed"] is True
    assert result["msg"] == (
        f"{root}/tokenizer is a link to a directory: {tmp_path}/tokenizer "
        "(only links to files are shipped, as the files they point at)"
    )
    # Left out by name, it is not looked at.
    assert run_module(dm, {"path": str(root), "exclude": ["tokenizer"]})["files"]


def test_module_writes_its_cache_but_not_in_check_mode(tmp_path, run_module):
    root = make_checkpoint(tmp_path / "ckpt")
    cache = tmp_path / "cache" / "manifest.json"
    result = run_module(dm, {"path": str(root), "cache": str(cache), "_ansible_check_mode": True})
    assert result["changed"] is False and not cache.exists()
    result = run_module(dm, {"path": str(root), "cache": str(cache)})
    assert result["changed"] is False
    assert set(json.loads(cache.read_text())) == {"config.json", "model.safetensors", "sub/extra.txt"}
    again = run_module(dm, {"path": str(root), "cache": str(cache)})
    assert again["hashed"] == [] and again["digest"] == result["digest"]


def test_module_fails_clearly_on_a_missing_or_empty_directory(tmp_path, run_module):
    result = run_module(dm, {"path": str(tmp_path / "nope")})
    assert result["failed"] and result["msg"] == f"{tmp_path / 'nope'} is not a directory"
    (tmp_path / "empty").mkdir()
    result = run_module(dm, {"path": str(tmp_path / "empty")})
    assert result["failed"] and result["msg"] == f"{tmp_path / 'empty'} holds no files"


def test_hashed_side_by_side_as_one_at_a_time(tmp_path):
    root = make_checkpoint(tmp_path / "ckpt")
    for shard in range(6):
        (root / f"model-{shard:05d}.safetensors").write_bytes(os.urandom(8192 + shard))
    alone, _ = cm.build_manifest(str(root), workers=1)
    together, _ = cm.build_manifest(str(root), workers=4)
    assert together == alone


def test_module_names_what_a_copy_got_wrong(tmp_path, run_module):
    source = make_checkpoint(tmp_path / "source")
    expected = run_module(dm, {"path": str(source)})["files"]
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    assert run_module(dm, {"path": str(copy), "compare": expected})["differs"] == []
    # Same size, one byte flipped: what a size-and-mtime check would take for whole.
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[100] ^= 0xFF
    (copy / "model.safetensors").write_bytes(bytes(data))
    (copy / "sub" / "extra.txt").unlink()
    (copy / "stray.bin").write_bytes(b"?")
    result = run_module(dm, {"path": str(copy), "compare": expected})
    assert result["differs"] == ["model.safetensors", "stray.bin", "sub/extra.txt"]
    assert "differs" not in run_module(dm, {"path": str(copy)})


def describe_on_the_controller(tmp_path, args, *options):
    """dir_manifest as a play runs it on the controller (its action); the run and the task's result."""
    playbook = tmp_path / "describe.yml"
    task = {"dir_manifest": args}
    play = {"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": [task]}
    playbook.write_text(json.dumps([play]))
    run = run_playbook(playbook, *options, inventory="localhost,")
    return run, run.one(host="localhost", action="dir_manifest")


def test_on_the_controller_it_runs_in_the_worker_as_the_module_would(tmp_path, run_module):
    root = make_checkpoint(tmp_path / "ckpt")
    cache = tmp_path / "cache" / "ckpt.json"
    run, result = describe_on_the_controller(tmp_path, {"path": str(root), "cache": str(cache)}, "--check")
    assert run.ok and not cache.exists(), str(run)
    run, result = describe_on_the_controller(tmp_path, {"path": str(root), "cache": str(cache)})
    assert run.ok and not result.changed, str(run)
    # No module ran: a module's result carries its invocation.
    assert "invocation" not in result.result and "invocation" in run_module(dm, {"path": str(root)})
    module = run_module(dm, {"path": str(root), "compare": result.result["files"]})
    assert {k: result.result[k] for k in ("files", "digest", "total_bytes")} == {
        k: module[k] for k in ("files", "digest", "total_bytes")
    }
    assert module["differs"] == []
    assert json.loads(cache.read_text()).keys() == {f["name"] for f in module["files"]}
    run, result = describe_on_the_controller(tmp_path, {"path": str(root), "cache": str(cache)})
    assert run.ok and result.result["hashed"] == [], str(run)
    run, _ = describe_on_the_controller(tmp_path, {"path": str(tmp_path / "nope")})
    assert not run.ok and run.failures() == [f"{tmp_path / 'nope'} is not a directory"], str(run)
