"""Small HTTP helpers for a vLLM OpenAI-compatible server, over urllib (standard library only).

Every failure is one of three exception types, each with a one-line message:

- ServerUnreachable: connection refused, timeout, name resolution, connection reset;
- AuthFailed (an HttpError): HTTP 401 or 403, "the server at <url> refused the API key (...)";
- HttpError: any other HTTP status >= 400, or a body that is not the JSON asked for; it carries the status
  and a short excerpt of the body.

Requests to loopback addresses bypass any proxy set in the environment (http_proxy and friends): a box
talking to its own server must not send the request (and the API key) through a proxy.
"""

import ipaddress
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPException

from ansible.module_utils.text_excerpt import EXCERPT_CHARS
from ansible.module_utils.text_excerpt import excerpt as _excerpt

__all__ = [
    "VllmApiError",
    "ServerUnreachable",
    "HttpError",
    "AuthFailed",
    "request",
    "get_text",
    "get_json",
    "post_json",
    "post_stream",
    "check_healthy",
    "excerpt",
]

USER_AGENT = "specfleet-vllm-api/1"


class VllmApiError(Exception):
    """Base class: a request to the vLLM server failed. str(exc) is one line; exc.url is the URL."""

    def __init__(self, message, url):
        super().__init__(message)
        self.url = url


class ServerUnreachable(VllmApiError):
    """No HTTP answer: connection refused, timeout, DNS failure, connection reset."""


class HttpError(VllmApiError):
    """The server answered with an HTTP error status (or a body that is not the JSON asked for)."""

    def __init__(self, message, url, status, body=""):
        super().__init__(message, url)
        self.status = status
        self.body = body


class AuthFailed(HttpError):
    """The server answered 401 or 403: the API key is missing or wrong."""


def excerpt(text, limit=EXCERPT_CHARS):
    """One line of at most `limit` characters of a body (whitespace collapsed), for an error message."""
    return _excerpt(text, limit, empty="(empty body)")


def _is_loopback(url):
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _opener(url):
    if _is_loopback(url):
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


def _reason(exc, timeout):
    """A few words for a connection-level failure."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return f"timed out after {timeout:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host name ({reason.strerror or reason})"
    if isinstance(reason, ConnectionResetError):
        return "connection reset by the server"
    if isinstance(reason, HTTPException):
        return f"the server closed the connection without a valid HTTP answer ({type(reason).__name__})"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


def _http_error(method, url, status, body, key_sent):
    if status in (401, 403):
        how = f"HTTP {status}" if key_sent else f"HTTP {status}, no API key was sent"
        message = f"the server at {url} refused the API key ({how}): {excerpt(body, 120)}"
        return AuthFailed(message, url, status, body)
    return HttpError(f"{method} {url} returned HTTP {status}: {excerpt(body)}", url, status, body)


def request(method, url, api_key=None, payload=None, timeout=30.0):
    """Send one request; return (status, body text) for a 2xx/3xx answer, raise VllmApiError otherwise.

    `payload` (any JSON-serialisable value) is sent as a JSON body. `api_key`, when given, goes in an
    ``Authorization: Bearer`` header.
    """
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json, text/plain;q=0.9, */*;q=0.1"}
    data = None
    if payload is not None:
        data = json.dumps(payload).encode("utf-8")
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with _opener(url).open(req, timeout=timeout) as response:
            status = response.status
            body = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read().decode("utf-8", errors="replace")
        except (OSError, HTTPException):
            body = ""
        raise _http_error(method, url, exc.code, body, bool(api_key)) from None
    except (urllib.error.URLError, OSError, HTTPException) as exc:
        raise ServerUnreachable(f"cannot reach {url}: {_reason(exc, timeout)}", url) from None
    return status, body


def _json_body(method, url, status, body):
    try:
        return json.loads(body)
    except ValueError:
        raise HttpError(
            f"{method} {url} returned HTTP {status} but not JSON: {excerpt(body)}", url, status, body
        ) from None


def get_text(url, api_key=None, timeout=30.0):
    """GET `url`; return (status, body text)."""
    return request("GET", url, api_key=api_key, timeout=timeout)


def get_json(url, api_key=None, timeout=30.0):
    """GET `url`; return (status, decoded JSON body)."""
    status, body = request("GET", url, api_key=api_key, timeout=timeout)
    return status, _json_body("GET", url, status, body)


def post_json(url, payload, api_key=None, timeout=30.0):
    """POST `payload` as JSON to `url`; return (status, decoded JSON body)."""
    status, body = request("POST", url, api_key=api_key, payload=payload, timeout=timeout)
    return status, _json_body("POST", url, status, body)


def post_stream(url, payload, api_key=None, timeout=30.0):
    """POST `payload` with "stream": true; yield (time.monotonic(), event) for each server-sent JSON event.

    The events of an OpenAI-style stream (``data: {...}`` lines, ended by ``data: [DONE]``); `timeout`
    bounds every read, not the whole stream.
    """
    headers = {"User-Agent": USER_AGENT, "Accept": "text/event-stream", "Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(dict(payload, stream=True)).encode("utf-8")
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with _opener(url).open(req, timeout=timeout) as response:
            for raw in response:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                body = line[len("data:") :].strip()
                if body == "[DONE]":
                    return
                yield time.monotonic(), _json_body("POST", url, response.status, body)
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read().decode("utf-8", errors="replace")
        except (OSError, HTTPException):
            body = ""
        raise _http_error("POST", url, exc.code, body, bool(api_key)) from None
    except (urllib.error.URLError, OSError, HTTPException) as exc:
        raise ServerUnreachable(f"cannot reach {url}: {_reason(exc, timeout)}", url) from None


def check_healthy(base_url, api_key=None, timeout=30.0):
    """GET <base_url>/health once; raise ServerUnreachable with one line unless it answers HTTP 200.

    No waiting: whoever starts the server waits until it serves (roles/vllm_service's readiness check).
    A 401/403 is raised as AuthFailed (the key, not the server, is the problem).
    """
    root = base_url.rstrip("/")
    url = root + "/health"
    try:
        status, _body = request("GET", url, api_key=api_key, timeout=timeout)
    except AuthFailed:
        raise
    except VllmApiError as exc:
        raise ServerUnreachable(f"no vLLM server serving at {root}: {exc}", url) from None
    if status != 200:
        raise ServerUnreachable(f"no vLLM server serving at {root}: GET {url} answered HTTP {status}", url)
