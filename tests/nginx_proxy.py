"""roles/vllm_proxy's site in a real nginx (Debian's own binary, unpacked by scripts/bootstrap.sh) in front of
a stand-in upstream that answers every route, as vLLM behind the proxy does without a key, and records the
path nginx passed on: the proxy's behaviour in seconds, without a box or a model (the gate scenario runs the
same site in front of a real vLLM)."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from driver import BIN, ROOT, run_playbook

NGINX = shutil.which("nginx", path=str(BIN))
PROXY_READY = ROOT / "roles/vllm_proxy/files/proxy_ready.py"
# Paths that name /metrics (or the loads) after nginx's normalizing, or vLLM's /metrics mount after the
# upstream's own decoding: encoded slashes and dots, dot segments, doubled slashes, a trailing "?".
PROBES = [
    "/metrics%2F..%2Fhealth",
    "/health%2F..%2Fmetrics",
    "/%2e%2e/metrics",
    "/health/../metrics",
    "/health/%2e%2e/metrics",
    "//metrics",
    "/metrics?",
    "/metrics/",
    "/metrics%2F",
    "/health/..%2Fmetrics",
    "/specfleet/loads?",
    "//specfleet/loads",
    "/specfleet/./loads",
    "/health%3F/../metrics",
]
# What the role's template reads: the role's defaults and vars, and the served values it names.
ROLE_VALUES = [
    "roles/served/defaults/main.yml",
    "roles/vllm_service/defaults/main.yml",
    "roles/vllm_proxy/defaults/main.yml",
    "roles/vllm_proxy/vars/main.yml",
]


def free_port(host="127.0.0.1"):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def render(tmp: Path, cases: dict[str, dict]) -> dict[str, Path]:
    """The site roles/vllm_proxy writes for each case (the inventory values that differ), in one run."""
    group = {"ansible_python_interpreter": sys.executable}
    for path in ROLE_VALUES:
        group.update(yaml.safe_load((ROOT / path).read_text()))
    # A capture case's definitions and locations beside its site (<name>-capture.conf, .locations), where its
    # site includes them.
    hosts = {
        name: {
            **values,
            "site_out": str(tmp / f"{name}.conf"),
            "capture_out": str(tmp / f"{name}-capture"),
            "__vllm_proxy_capture_locations": str(tmp / f"{name}-capture.locations"),
        }
        for name, values in cases.items()
    }
    inventory = tmp / "render-inventory.json"
    inventory.write_text(json.dumps({"all": {"vars": group, "hosts": hosts}}))
    run = run_playbook("tests/proxy_site/render.yml", "--forks", "10", inventory=inventory)
    assert run.ok, str(run)
    return {name: tmp / f"{name}.conf" for name in cases}


class Upstream:
    """A stand-in for vLLM on loopback: every route answers 200, and each request's path is kept."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                upstream.seen.append((self.command, self.path))
                path = self.path.split("?", 1)[0]
                if path == "/health":
                    body = b""
                elif path.startswith("/metrics"):
                    body = b"vllm:num_requests_running 0\n"
                elif path == "/v1/models":
                    body = json.dumps({"data": [{"id": "tiny"}]}).encode()
                elif path == "/v1/completions":
                    body = json.dumps({"choices": [{"text": " Paris"}]}).encode()
                else:
                    body = json.dumps({"path": self.path}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class Nginx:
    """nginx with the site included as the boxes' nginx.conf includes conf.d/ (inside http {}), run as its
    master would be, with its own prefix; `site` is the path it includes (copy a rendered site there)."""

    def __init__(self, tmp: Path):
        self.tmp = tmp / "nginx"
        self.tmp.mkdir(exist_ok=True)
        self.site = self.tmp / "site.conf"
        # The capture's definitions, as conf.d/ holds them beside the site (start's `capture`).
        self.capture = self.tmp / "capture.conf"
        temp = " ".join(
            f"{kind}_temp_path {self.tmp}/{kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        self.conf = self.tmp / "nginx.conf"
        self.conf.write_text(
            f"user root root;\nworker_processes 1;\npid {self.tmp}/nginx.pid;\n"
            f"error_log {self.tmp}/error.log;\n"
            f"events {{}}\nhttp {{\n    {temp}\n    access_log off;\n    include {self.capture}*;\n"
            f"    include {self.site};\n}}\n"
        )
        self.process = None
        # roles/vllm_proxy's check reloads with systemctl: here, this nginx's own reload.
        shim = self.tmp / "bin" / "systemctl"
        shim.parent.mkdir(exist_ok=True)
        shim.write_text(f"#!/bin/sh\nexec {NGINX} -p {self.tmp} -c {self.conf} -s reload\n")
        shim.chmod(0o755)

    def argv(self, *args):
        return [NGINX, "-p", str(self.tmp), "-c", str(self.conf), *args]

    def check(self, site: Path) -> subprocess.CompletedProcess:
        """nginx -t on the site, as the role's template validate does."""
        shutil.copy(site, self.site)
        return subprocess.run(self.argv("-t", "-q"), capture_output=True, text=True, check=False)

    def start(self, site: Path, port: int):
        shutil.copy(site, self.site)
        definitions = site.with_name(f"{site.stem}-capture.conf")
        if definitions.exists():
            shutil.copy(definitions, self.capture)
        self.process = subprocess.Popen(self.argv("-g", "daemon off;"), stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return self
            except OSError:
                if self.process.poll() is not None:
                    raise AssertionError(f"nginx exited: {self.process.stderr.read()}") from None
                time.sleep(0.05)
        raise AssertionError(f"nginx did not listen on {port}: {(self.tmp / 'error.log').read_text()}")

    def replace_site(self, site: Path):
        """Another site on disk, as the role's template task writes it (nginx reads it when reloaded)."""
        shutil.copy(site, self.site)

    def ready(self, *args) -> subprocess.CompletedProcess:
        """roles/vllm_proxy's clients' path check, as the role runs it on the box."""
        return subprocess.run(
            [sys.executable, str(PROXY_READY), "--site", str(self.site), *args],
            capture_output=True,
            text=True,
            check=False,
            env={"PATH": f"{self.tmp / 'bin'}:/usr/bin:/bin"},
        )

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def request(
    port, method, path, key=None, host="127.0.0.1", source=None, body=None, context=None, scheme=None
):
    """(status, body) of one request to the proxy, from `source` (an address of the box) where given."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = key if key.startswith(("Bearer ", "bearer ")) else f"Bearer {key}"
    source_address = (source, 0) if source else None
    if context is not None:
        connection = http.client.HTTPSConnection(
            host, port, timeout=10, context=context, source_address=source_address
        )
    else:
        connection = http.client.HTTPConnection(host, port, timeout=10, source_address=source_address)
    try:
        # skip_host: a raw path (encoded, dotted) goes as written, as curl --path-as-is sends it.
        connection.putrequest(method, path, skip_accept_encoding=True)
        payload = json.dumps(body).encode() if body is not None else b""
        for name, value in {**headers, "Content-Length": str(len(payload))}.items():
            connection.putheader(name, value)
        connection.endheaders(payload)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def certificate_authority(tmp: Path, address="127.0.0.1"):
    """A CA the test makes, and a certificate it signs for `address`: (ca.pem, its PEM text, its key's)."""
    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject, issuer, public_key, signing_key, ca, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(signing_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = certificate("specfleet test CA", "specfleet test CA", ca_key.public_key(), ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    san = [x509.IPAddress(ipaddress.ip_address(address))]
    cert = certificate(address, "specfleet test CA", key.public_key(), ca_key, False, san)
    pem = serialization.Encoding.PEM
    (tmp / "ca.pem").write_bytes(ca.public_bytes(pem))
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return tmp / "ca.pem", cert.public_bytes(pem).decode(), key_pem.decode()


def tls_context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))
