"""The clients' path through the proxy, checked from the box as a client comes (roles/vllm_proxy's
tasks/ready.yml runs it there).

Everything is read from the site on disk (its listen address, TLS certificate, first API key and
revision), so a site a restore put back is checked as it was recorded:
  1. nginx serves this file: its revision location answers the file's revision (else nginx is reloaded
     once, and a reload it could not apply - a port already taken, a certificate gone - is said);
  2. where the site has a certificate, the one served is that certificate;
  3. /health answers 200;
  4. with API keys, a completion without a key is refused (401);
  5. the models listed and one completion answer with the site's first key.

Prints one JSON line ({url, revision, model, completion}) and exits 0, or one line saying what failed
and exits 1. Standard library only (the box's Python).
"""

import argparse
import contextlib
import http.client
import json
import re
import ssl
import subprocess
import sys
import time

REVISION = re.compile(r'location = (/\S+) \{[^}]*?return 200 "([0-9a-f]{40})\\n";', re.S)
KEY = re.compile(r'^\s*"~\^\(\?i:Bearer\) \+(.+)\$" 1;$', re.M)
LISTEN = re.compile(r"^[ \t]*listen[ \t]+([^\s;]+)([^;]*);", re.M)
CERTIFICATE = re.compile(r"^[ \t]*ssl_certificate[ \t]+([^\s;]+);", re.M)


class PathError(Exception):
    """str() is the one line that says what failed."""


def read_site(text):
    """What the site says of itself: {host, port, tls, certificate, keys, revision_path, revision}."""
    listen = LISTEN.search(text)
    revision = REVISION.search(text)
    if not listen or not revision:
        raise PathError("the site has no listen address or no revision: not one roles/vllm_proxy wrote")
    address, flags = listen.group(1), listen.group(2).split()
    if address.isdigit():
        host, port = "127.0.0.1", address
    elif address.startswith("["):
        host, port = address[1:].split("]:")
    else:
        host, port = address.rsplit(":", 1)
    certificate = CERTIFICATE.search(text)
    return {
        # A wildcard listener answers on loopback ("::" with ipv6only=off: on IPv4 too).
        "host": "127.0.0.1" if host in ("0.0.0.0", "::") else host,
        "port": int(port),
        "tls": "ssl" in flags,
        "certificate": certificate.group(1) if certificate else None,
        # The template writes each character but letters and digits as a class of its own: [c].
        "keys": [re.sub(r"\[(.)\]", r"\1", key) for key in KEY.findall(text)],
        "revision_path": revision.group(1),
        "revision": revision.group(2),
    }


class Client:
    """Requests to the proxy's listening address, as a client sends them (TLS where the site has it)."""

    def __init__(self, site, timeout):
        self.site, self.timeout = site, timeout
        host = site["host"]
        self.url = (
            f"{'https' if site['tls'] else 'http'}://{f'[{host}]' if ':' in host else host}:{site['port']}"
        )

    def connection(self):
        if not self.site["tls"]:
            return http.client.HTTPConnection(self.site["host"], self.site["port"], timeout=self.timeout)
        # The certificate is compared with the site's own below: a box's name need not resolve on the box.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(
            self.site["host"], self.site["port"], timeout=self.timeout, context=context
        )

    def request(self, method, path, body=None, key=None):
        """(status, body text, the server's certificate in DER or None)."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        # The box's own probe: the capture of the clients' traffic leaves it out (templates/capture.conf.j2).
        headers["X-Specfleet-Probe"] = "1"
        if key:
            headers["Authorization"] = f"Bearer {key}"
        connection = self.connection()
        try:
            connection.request(method, path, json.dumps(body) if body is not None else None, headers)
            served = connection.sock.getpeercert(binary_form=True) if self.site["tls"] else None
            response = connection.getresponse()
            return response.status, response.read().decode("utf-8", "replace"), served
        except (OSError, http.client.HTTPException) as error:
            raise PathError(f"{method} {self.url}{path}: {error}") from None
        finally:
            connection.close()


def served_revision(client):
    """The revision nginx serves, None where nothing answers (a short wait: a reload applies in moments)."""
    try:
        status, body, _ = Client(client.site, min(client.timeout, 10)).request(
            "GET", client.site["revision_path"]
        )
    except PathError:
        return None
    return body.strip() if status == 200 else f"HTTP {status}"


def wait_for_revision(client, wait):
    """nginx serves the site on disk, reloaded once where it did not (a site a restore put back, or a reload
    still under way), within `wait` seconds of that reload."""
    wanted = client.site["revision"]
    seen = served_revision(client)
    if seen == wanted:
        return
    # Without systemctl (not a systemd box), what nginx serves says the rest.
    with contextlib.suppress(OSError):
        subprocess.run(["systemctl", "reload", "nginx"], check=False, capture_output=True)
    deadline = time.monotonic() + wait
    while seen != wanted:
        if time.monotonic() >= deadline:
            raise PathError(
                f"nginx at {client.url} serves {'nothing' if seen is None else 'revision ' + seen}, not "
                f"the site on disk (revision {wanted}): the reload was not applied (journalctl --unit nginx "
                "says why)"
            )
        time.sleep(0.2)
        seen = served_revision(client)


def first_certificate(path):
    with open(path, encoding="ascii") as pem:
        text = pem.read()
    block = re.search(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", text, re.S)
    if not block:
        raise PathError(f"{path} holds no certificate")
    return ssl.PEM_cert_to_DER_cert(block.group(0))


def check(site, wait, timeout, prompt):
    client = Client(site, timeout)
    wait_for_revision(client, wait)
    status, _, served = client.request("GET", "/health")
    if site["tls"] and served != first_certificate(site["certificate"]):
        raise PathError(f"{client.url} serves another certificate than {site['certificate']}")
    if status != 200:
        raise PathError(f"GET {client.url}/health answered {status}")
    key = site["keys"][0] if site["keys"] else None
    completion = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
    if key:
        status, _, _ = client.request("POST", "/v1/completions", completion)
        if status != 401:
            raise PathError(f"POST {client.url}/v1/completions without a key answered {status}, not 401")
    status, body, _ = client.request("GET", "/v1/models", key=key)
    if status != 200:
        raise PathError(
            f"GET {client.url}/v1/models with the site's first key answered {status}: {body[:200]}"
        )
    model = json.loads(body)["data"][0]["id"]
    status, body, _ = client.request("POST", "/v1/completions", {**completion, "model": model}, key=key)
    if status != 200:
        raise PathError(
            f"POST {client.url}/v1/completions with the site's first key answered {status}: {body[:200]}"
        )
    text = json.loads(body)["choices"][0]["text"]
    return {"url": client.url, "revision": site["revision"], "model": model, "completion": text}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", required=True, help="the proxy's nginx site")
    parser.add_argument("--wait", type=float, default=10, help="seconds nginx may take to serve the site")
    parser.add_argument("--timeout", type=float, default=300, help="seconds a request may take")
    parser.add_argument("--prompt", default="The capital of France is")
    args = parser.parse_args()
    try:
        with open(args.site, encoding="utf-8") as site:
            found = read_site(site.read())
        print(json.dumps(check(found, args.wait, args.timeout, args.prompt)))
    except (PathError, OSError, ValueError, LookupError) as error:
        print(f"the clients' path: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
