"""After side_effect: a second passing drafter shipped from the controller, the first again from a
path on the box, the second's weights over HTTP (a release of its own, readable by the server); the
corrupted checkpoint never went live."""

import json
from pathlib import Path

from sim_box_client import chat, counter, one_chat

ROOT = Path(__file__).resolve().parents[3]

DRAFTERS = "/srv/drafters"


def release(host, link):
    """The release a link points at, and its recorded metadata."""
    target = host.file(f"{DRAFTERS}/{link}").linked_to
    return target, json.loads(host.file(f"{target}/.release.json").content_string)


def test_current_is_the_http_release_and_previous_the_first(host):
    current, current_meta = release(host, "current")
    previous, previous_meta = release(host, "previous")
    # The box-path ship found the release the controller had published (same content, same id, so the
    # record keeps its first source); the HTTP ship, two files of the second drafter, is a release of its own.
    assert current_meta["source"] == "http://127.0.0.1:8765"
    assert sorted(entry["name"] for entry in current_meta["files"]) == ["config.json", "model.safetensors"]
    assert previous_meta["source"].endswith("/build/sim-models/eagle3-known-3.4")
    assert current == f"{DRAFTERS}/releases/{current_meta['id']}"
    assert previous == f"{DRAFTERS}/releases/{previous_meta['id']}"
    assert current_meta["id"] == current_meta["digest"][:12]


def test_release_holds_exactly_the_shipped_files(host):
    current, meta = release(host, "current")
    for entry in meta["files"]:
        shipped = host.file(f"{current}/{entry['name']}")
        assert shipped.size == entry["size"]
        assert shipped.sha256sum == entry["sha256"]


def test_corrupted_checkpoint_stayed_in_staging(host):
    releases = host.check_output(f"ls {DRAFTERS}/releases").split()
    staged = [name for name in releases if name.endswith(".partial")]
    assert len(staged) == 1, releases
    published = [name for name in releases if not name.endswith(".partial")]
    assert len(published) == 3, releases  # the first, the second, the second over HTTP
    assert host.file(f"{DRAFTERS}/releases/{staged[0]}/model.safetensors").size == 100000


def test_last_box_side_source_is_in_incoming(host):
    assert host.file(f"{DRAFTERS}/incoming/model.safetensors").sha256sum == (
        host.file("/srv/http-drafters/eagle3-known-3.0/model.safetensors").sha256sum
    )


def test_server_speculates_with_the_current_release(host):
    unit = host.file("/etc/systemd/system/vllm.service").content_string
    assert f'"model": "{DRAFTERS}/current"' in unit
    assert host.service("vllm").is_running
    drafted = counter(host, "vllm:spec_decode_num_draft_tokens_total")
    accepted = counter(host, "vllm:spec_decode_num_accepted_tokens_total")
    assert chat(host, max_tokens=32).strip()
    # The second drafter is live: its known acceptance, to the token.
    drafts, accepted_tokens = one_chat("eagle3-known-3.0", 32)
    assert counter(host, "vllm:spec_decode_num_draft_tokens_total") - drafted == 3 * drafts
    assert counter(host, "vllm:spec_decode_num_accepted_tokens_total") - accepted == accepted_tokens
