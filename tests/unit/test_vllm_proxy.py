"""roles/vllm_proxy's site in Debian's nginx, as an operator uses it and an attacker probes it
(tests/nginx_proxy.py): keys of any length and of the common generators' alphabets, compared exactly; several
keys at once while they rotate; no way around the allow-list by encoded or dotted paths; a dual-stack listener
on "::"; TLS with a CA the test makes; the clients' path check (files/proxy_ready.py), which catches a
reload nginx did not apply and a proxy that cannot serve; and the capture of the box's own traffic, with the
timer's script that bounds it (files/capture_prune.py)."""

import base64
import datetime
import importlib.util
import json
import os
import secrets
import socket
import stat

import pytest
from nginx_proxy import (
    NGINX,
    PROBES,
    PROXY_READY,
    Nginx,
    Upstream,
    certificate_authority,
    free_port,
    render,
    request,
    tls_context,
)

# In CI (CI=true) a missing nginx fails these tests instead of skipping them.
pytestmark = pytest.mark.skipif(
    NGINX is None and os.environ.get("CI") != "true", reason="nginx: scripts/bootstrap.sh unpacks it"
)

KEYS = {
    "openssl rand -hex 32": secrets.token_hex(32),
    "128 characters": secrets.token_urlsafe(96),
    "openssl rand -base64 32": base64.b64encode(secrets.token_bytes(32)).decode(),
    "sk- generator": "sk-proj-" + secrets.token_urlsafe(48),
    "every other character a bearer token holds": "a.b~c_d-e+f/g" + "=" * 2,
}
OLD_KEY, NEW_KEY = secrets.token_hex(32), secrets.token_hex(32)
PROMETHEUS = "10.9.9.9"
CAPTURE_PRUNE = PROXY_READY.parent / "capture_prune.py"


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    return certificate_authority(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def sites(tmp_path_factory, upstream, certificates):
    """Every case's site, rendered in one run; each with a port of its own."""
    tmp = tmp_path_factory.mktemp("sites")
    _ca, certificate, key = certificates
    ports = {}

    def case(name, **values):
        ports[name] = free_port()
        return name, {
            "vllm_service_port": ports[name],
            "vllm_service_backend_port": upstream.port,
            "vllm_service_loads_dir": str(tmp / "loads"),
            "vllm_service_metrics_sources": [PROMETHEUS],
            **values,
        }

    cases = dict(
        [
            case("keys", vllm_service_api_keys=list(KEYS.values())),
            case("old_key", vllm_service_api_key=OLD_KEY),
            case("rotating", vllm_service_api_keys=[NEW_KEY, OLD_KEY]),
            case("new_key", vllm_service_api_key=NEW_KEY),
            case("open", vllm_service_open=True),
            case("dual_stack", vllm_service_api_key=OLD_KEY, vllm_service_host="::"),
            case("no_timeout", vllm_service_api_key=OLD_KEY, vllm_proxy_timeout_s=0),
            case("capture_all", vllm_service_api_key=OLD_KEY, **capture(tmp / "capture_all", 100)),
            case("capture_half", vllm_service_api_key=OLD_KEY, **capture(tmp / "capture_half", 50)),
            case(
                "tls",
                vllm_service_api_key=OLD_KEY,
                vllm_proxy_tls_certificate=certificate,
                vllm_proxy_tls_certificate_key=key,
                vllm_proxy_tls_certificate_file=str(tmp / "tls.crt"),
                vllm_proxy_tls_certificate_key_file=str(tmp / "tls.key"),
            ),
        ]
    )
    for name in ("capture_all", "capture_half"):
        (tmp / name).mkdir(mode=0o700)  # tasks/capture.yml makes it before the site
    (tmp / "tls.crt").write_text(certificate)
    (tmp / "tls.key").write_text(key)
    (tmp / "loads").mkdir()
    (tmp / "loads" / "loads.prom").write_text("specfleet_vllm_kept_loads 1\n")
    rendered = render(tmp, cases)
    return {name: (path, ports[name]) for name, path in rendered.items()}


def capture(directory, percent):
    """The capture's values, into `directory`, with a request budget small enough to be passed."""
    return {
        "vllm_proxy_capture": True,
        "vllm_proxy_capture_percent": percent,
        "vllm_proxy_capture_dir": str(directory),
        "vllm_proxy_capture_max_request_bytes": 4096,
    }


@pytest.fixture
def nginx(tmp_path):
    server = Nginx(tmp_path)
    yield server
    server.stop()


def serve(nginx, sites, name):
    site, port = sites[name]
    nginx.start(site, port)
    return port


def completion(port, key, **where):
    return request(port, "POST", "/v1/completions", key, body={"model": "tiny", "prompt": "The"}, **where)


def test_keys_of_any_length_and_alphabet_pass_nginx_s_check_and_are_accepted(nginx, sites):
    """Finding 1: a key of 40 characters or more in the old site's map overflowed map_hash_bucket_size
    (`-e vllm_service_api_key=$(openssl rand -hex 32)`, the old_key case, failed nginx -t)."""
    for case in ("old_key", "keys"):
        checked = nginx.check(sites[case][0])
        assert checked.returncode == 0, (case, checked.stderr)
    port = serve(nginx, sites, "keys")
    for generator, key in KEYS.items():
        assert completion(port, key)[0] == 200, generator
    assert completion(port, None)[0] == 401


def test_a_key_is_compared_exactly(nginx, sites):
    """Finding 6: nginx compares a map's strings ignoring case; a key differs by its case, a character or
    its length. The scheme itself is case-insensitive (RFC 7235)."""
    port = serve(nginx, sites, "keys")
    key = KEYS["openssl rand -hex 32"]
    for wrong in (key.upper(), key[:-1], key + "0", key[:-1] + ("a" if key[-1] != "a" else "b"), f"x{key}"):
        assert completion(port, wrong)[0] == 401, wrong
    # Regular expression characters in a key stand for themselves: "." is not any character.
    dotted = KEYS["every other character a bearer token holds"]
    assert completion(port, dotted.replace(".", "X"))[0] == 401
    assert completion(port, dotted.replace("+", ""))[0] == 401
    assert completion(port, f"bearer {key}")[0] == 200
    assert completion(port, None)[0] == 401


def test_old_and_new_keys_both_serve_while_they_rotate(nginx, sites):
    port = serve(nginx, sites, "rotating")
    assert completion(port, NEW_KEY)[0] == 200
    assert completion(port, OLD_KEY)[0] == 200
    assert completion(port, secrets.token_hex(32))[0] == 401


def test_no_way_around_the_allow_list(nginx, sites, upstream):
    """Finding 4: from an address not on the list, /metrics%2F..%2Fhealth reached vLLM's /metrics through the
    /health location, which passed the raw path on. Every probe is refused, or is /health itself: vLLM gets
    the normalized path alone."""
    port = serve(nginx, sites, "old_key")
    outsider = "127.0.0.2"  # not the box's loopback 127.0.0.1, not the Prometheus
    assert request(port, "GET", "/metrics", source=outsider)[0] == 403
    assert request(port, "GET", "/specfleet/loads", source=outsider)[0] == 403
    assert request(port, "GET", "/metrics", source="127.0.0.1") == (200, "vllm:num_requests_running 0\n")
    assert request(port, "GET", "/specfleet/loads", source="127.0.0.1")[1] == "specfleet_vllm_kept_loads 1\n"
    upstream.seen.clear()
    answers = {path: request(port, "GET", path, source=outsider) for path in PROBES}
    leaked = {
        path: answer
        for path, answer in answers.items()
        if "vllm:" in answer[1] or "specfleet_vllm" in answer[1]
    }
    assert not leaked, leaked
    assert {status for status, _ in answers.values()} <= {200, 400, 401, 403, 404}, answers
    # What reached the upstream without a key: /health, exactly (its query as the client sent it).
    assert {path.split("?", 1)[0] for _, path in upstream.seen} <= {"/health"}, upstream.seen


def test_paths_reach_vllm_normalized(nginx, sites, upstream):
    """With the key, vLLM gets the normalized path, never the raw one a client wrote."""
    port = serve(nginx, sites, "old_key")
    upstream.seen.clear()
    assert request(port, "GET", "/v1/../metrics%2F", OLD_KEY)[0] == 200
    assert request(port, "GET", "/v1//models?x=1", OLD_KEY)[0] == 200
    assert upstream.seen == [("GET", "/metrics/"), ("GET", "/v1/models?x=1")]


def test_an_open_server_answers_without_a_key(nginx, sites):
    port = serve(nginx, sites, "open")
    assert completion(port, None)[0] == 200
    assert nginx.ready().returncode == 0


def test_a_dual_stack_listener_on_the_ipv6_wildcard(nginx, sites):
    """Finding 7: "::" gave nginx an IPv6-only listener, and IPv4 clients were refused."""
    port = serve(nginx, sites, "dual_stack")
    assert completion(port, OLD_KEY, host="127.0.0.1")[0] == 200
    assert completion(port, OLD_KEY, host="::1")[0] == 200


def test_the_clients_path_check_passes_a_serving_proxy(nginx, sites):
    serve(nginx, sites, "old_key")
    checked = nginx.ready()
    assert checked.returncode == 0, checked.stdout
    said = json.loads(checked.stdout)
    assert (said["model"], said["completion"]) == ("tiny", " Paris")
    assert said["url"] == f"http://127.0.0.1:{sites['old_key'][1]}"


def test_a_key_change_is_a_reload_and_the_check_sees_it_applied(nginx, sites):
    """Rotation: the site with both keys, then the new one alone; nginx reloads, and the check proves the
    site on disk is the one served, with its first key."""
    port = serve(nginx, sites, "old_key")
    for name, accepted, refused in (("rotating", [NEW_KEY, OLD_KEY], []), ("new_key", [NEW_KEY], [OLD_KEY])):
        nginx.replace_site(sites[name][0].with_name(f"{name}.conf"))
        # Rendered for another port: the same port here, as a key change keeps it.
        nginx.site.write_text(nginx.site.read_text().replace(f"listen {sites[name][1]};", f"listen {port};"))
        checked = nginx.ready()
        assert checked.returncode == 0, checked.stdout
        assert all(completion(port, key)[0] == 200 for key in accepted), name
        assert all(completion(port, key)[0] == 401 for key in refused), name


def test_a_reload_nginx_did_not_apply_is_caught(nginx, sites):
    """Finding 5: `systemctl reload nginx` exits 0 when nginx could not apply the new site (its port is
    taken): the check finds nginx still serving the old revision, and says so in one line."""
    port = serve(nginx, sites, "old_key")
    taken, new_port = socket.socket(), free_port()
    taken.bind(("127.0.0.1", new_port))
    taken.listen()
    try:
        moved = (
            sites["new_key"][0].read_text().replace(f"listen {sites['new_key'][1]};", f"listen {new_port};")
        )
        nginx.site.write_text(moved)
        checked = nginx.ready("--wait", "2", "--timeout", "2")
    finally:
        taken.close()
    assert checked.returncode == 1, checked.stdout
    [line] = checked.stdout.splitlines()
    assert line.startswith(
        f"the clients' path: nginx at http://127.0.0.1:{new_port} serves nothing, not the site on disk"
    ), line
    assert line.endswith("the reload was not applied (journalctl --unit nginx says why)"), line
    # nginx goes on serving the old site.
    assert completion(port, OLD_KEY)[0] == 200


def test_a_proxy_that_cannot_serve_fails_the_check(nginx, sites):
    """Finding 5: vllm_proxy_timeout_s 0 passed nginx -t, then every request through the proxy got 504 (the
    inventory check refuses it now; the check catches whatever else leaves a proxy unable to serve)."""
    site, _ = sites["no_timeout"]
    assert nginx.check(site).returncode == 0
    serve(nginx, sites, "no_timeout")
    checked = nginx.ready("--timeout", "10")
    assert checked.returncode == 1, checked.stdout
    assert "answered 504" in checked.stdout, checked.stdout


def test_tls_with_a_ca_the_test_makes(nginx, sites, certificates):
    """Finding 8: the key crossed the network in cleartext. With a certificate, clients verify it against
    their CA; plain HTTP on the port is refused; the check compares the certificate served with the site's."""
    ca, _, _ = certificates
    port = serve(nginx, sites, "tls")
    context = tls_context(ca)
    assert completion(port, OLD_KEY, context=context)[0] == 200
    assert completion(port, None, context=context)[0] == 401
    assert request(port, "GET", "/health")[0] == 400  # plain HTTP: nginx's "sent to HTTPS port"
    checked = nginx.ready()
    assert checked.returncode == 0, checked.stdout
    assert json.loads(checked.stdout)["url"] == f"https://127.0.0.1:{port}"


def test_a_certificate_and_a_key_that_do_not_match_fail_nginx_s_check(nginx, sites, tmp_path):
    site, _ = sites["tls"]
    _, _, other_key = certificate_authority(tmp_path)
    text = site.read_text()
    key_file = tmp_path / "other.key"
    key_file.write_text(other_key)
    mismatched = tmp_path / "mismatched.conf"
    mismatched.write_text(
        text.replace(text.split("ssl_certificate_key ", 1)[1].split(";", 1)[0], str(key_file))
    )
    checked = nginx.check(mismatched)
    assert checked.returncode != 0 and "key values mismatch" in checked.stderr, checked.stderr


def test_the_check_reads_the_site_s_keys_back_as_written(sites):
    """proxy_ready.py takes the first key from the site on disk (after a restore, the recorded one)."""
    spec = importlib.util.spec_from_file_location("proxy_ready", PROXY_READY)
    proxy_ready = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(proxy_ready)
    site = proxy_ready.read_site(sites["keys"][0].read_text())
    assert site["keys"] == list(KEYS.values())
    assert (site["host"], site["port"], site["tls"]) == ("127.0.0.1", sites["keys"][1], False)
    assert proxy_ready.read_site(sites["open"][0].read_text())["keys"] == []


def load_capture_prune():
    spec = importlib.util.spec_from_file_location("capture_prune", CAPTURE_PRUNE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chat(port, key, content="Why is the sky blue?", **fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], **fields}
    return request(port, "POST", "/v1/chat/completions", key, body=body), body


def prune(directory, max_bytes=10**6, retention_days=7):
    """The timer's run, as its unit runs it; the sample after it."""
    load_capture_prune().main(
        ["--dir", str(directory), "--max-bytes", str(max_bytes), "--retention-days", str(retention_days)]
    )
    sample = directory / "sample.jsonl"
    assert stat.S_IMODE(sample.stat().st_mode) == 0o600
    return [json.loads(line) for line in sample.read_text().splitlines()]


def test_capture_keeps_the_bodies_of_answered_completions_and_nothing_else(nginx, sites):
    """At 100%: the bodies of the chat and completion requests vLLM answered, as sent (sampling parameters
    included); never a key, a refused request, another route, a body over the request budget or the box's own
    probe; nginx goes on writing after the timer's run empties its log."""
    port = serve(nginx, sites, "capture_all")
    directory = sites["capture_all"][0].parent / "capture_all"
    (status, _), sent = chat(port, OLD_KEY, temperature=0.7, top_p=0.9, max_tokens=32, seed=3)
    assert status == 200
    completion_body = {"model": "tiny", "prompt": "The", "max_tokens": 8}
    assert request(port, "POST", "/v1/completions", OLD_KEY, body=completion_body)[0] == 200
    assert chat(port, "not-the-key")[0][0] == 401
    assert request(port, "GET", "/v1/models", OLD_KEY)[0] == 200
    assert request(port, "POST", "/v1/embeddings", OLD_KEY, body={"input": "x"})[0] == 200
    assert chat(port, OLD_KEY, content="x" * 8192)[0][0] == 200  # over the 4096-byte budget
    assert nginx.ready().returncode == 0  # the box's own probe, a completion with the key
    assert OLD_KEY not in (directory / "incoming.log").read_text()
    kept = prune(directory)
    assert [(entry["path"], entry["body"]) for entry in kept] == [
        ("/v1/chat/completions", sent),
        ("/v1/completions", completion_body),
    ]
    assert (directory / "incoming.log").stat().st_size == 0
    (status, _), later = chat(port, OLD_KEY, content="And the sunset red?")
    assert status == 200
    assert [entry["body"] for entry in prune(directory)][-1] == later


def test_capture_keeps_the_share_it_is_given(nginx, sites):
    """At 50%, by request id: of 200 answered requests, a share within 5 standard deviations of 100."""
    port = serve(nginx, sites, "capture_half")
    for n in range(200):
        assert chat(port, OLD_KEY, content=f"Count to {n}.")[0][0] == 200
    kept = prune(sites["capture_half"][0].parent / "capture_half")
    assert 100 - 5 * 7.1 < len(kept) < 100 + 5 * 7.1, len(kept)


def test_capture_is_off_by_default(sites):
    """Without vllm_proxy_capture nothing keeps a request: the site logs nothing, and the capture's files,
    which it would include, are not written."""
    site = sites["old_key"][0]
    assert "access_log" not in site.read_text() and "request_body" not in site.read_text()
    assert not list(site.parent.glob("old_key-capture.*"))


def test_the_sample_keeps_the_newest_within_its_age_and_size(tmp_path):
    """The timer's bounds: requests older than the retention go, then the oldest until the sample fits; a
    line that is not a capture (an empty body, a broken line) is dropped."""
    capture_prune = load_capture_prune()
    now = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.timezone.utc)

    def logged(hours_ago, content):
        when = (now - datetime.timedelta(hours=hours_ago)).isoformat()
        body = json.dumps({"messages": [{"role": "user", "content": content}]})
        return json.dumps({"time": when, "path": "/v1/chat/completions", "body": body})

    lines = [logged(200, "too old"), logged(3, "old"), logged(2, "mid"), logged(1, "new")]
    lines += [json.dumps({"time": now.isoformat(), "path": "/v1/completions", "body": ""}), "{broken"]
    (tmp_path / "incoming.log").write_text("\n".join(lines) + "\n")
    entry_bytes = len(json.dumps(next(capture_prune.captures([lines[1]])), separators=(",", ":"))) + 1
    assert capture_prune.prune(tmp_path, 2 * entry_bytes + 2, 7, now=now) == 2
    sample = [json.loads(line) for line in (tmp_path / "sample.jsonl").read_text().splitlines()]
    assert [entry["body"]["messages"][0]["content"] for entry in sample] == ["mid", "new"]
    assert capture_prune.prune(tmp_path, 10**6, 1.5 / 24, now=now) == 1  # 1.5 h: "new" alone
