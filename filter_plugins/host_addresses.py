"""host_addresses: the addresses of inventory hosts, as the controller resolves each one's ansible_host (or
its name), for an allow-list that takes addresses only (roles/vllm_proxy's /metrics). A host reached other
than over the network (a local or container connection) has no address to give: it is left out, and an
inventory names its address itself.

not_networks: the entries of such a list that are neither an address nor a network (CIDR), which nginx's
allow would refuse only once the site is written (roles/validate_inventory refuses them first)."""

import ipaddress
import socket

from ansible.errors import AnsibleFilterError

NOT_NETWORK = {"local", "podman", "containers.podman.podman", "docker", "community.docker.docker"}


def host_addresses(hosts, hostvars):
    addresses = []
    for host in hosts:
        if str(hostvars[host].get("ansible_connection", "ssh")) in NOT_NETWORK:
            continue
        name = str(hostvars[host].get("ansible_host", host))
        try:
            addresses.append(str(ipaddress.ip_address(name)))
            continue
        except ValueError:
            pass
        try:
            found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except OSError as error:
            raise AnsibleFilterError(
                f"{host}: its address {name} does not resolve on the controller ({error.strerror}): list "
                "the Prometheus servers' addresses in vllm_service_metrics_sources"
            ) from None
        addresses.extend(sorted({entry[4][0] for entry in found} - set(addresses)))
    return addresses


def not_networks(entries):
    wrong = []
    for entry in entries:
        try:
            # nginx takes a network whose address has host bits set (it warns), as strict=False does.
            ipaddress.ip_network(str(entry), strict=False)
        except ValueError:
            wrong.append(str(entry))
    return wrong


class FilterModule:
    def filters(self):
        return {"host_addresses": host_addresses, "not_networks": not_networks}
