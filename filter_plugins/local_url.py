"""local_url: where a server bound to `host` answers on its own box, as a URL: the loopback address for a
wildcard bind (0.0.0.0, ::), else the address it is bound to (a server bound to one address does not
answer on 127.0.0.1). The readiness check, the gate, the tuner, the spec watcher and the fleet report's
read all call the server from its box."""

from ansible.errors import AnsibleFilterError

LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "[::1]"}


def local_url(host, port):
    host = str(host or "").strip()
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise AnsibleFilterError(f"local_url: port {port!r} is not a number") from None
    address = LOOPBACK.get(host) or (f"[{host.strip('[]')}]" if ":" in host else host)
    return f"http://{address}:{port}"


class FilterModule:
    def filters(self):
        return {"local_url": local_url}
