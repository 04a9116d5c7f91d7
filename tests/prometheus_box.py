"""A real Prometheus beside a scenario's sim box: Debian's own package in a box of its own
(sim/build-prometheus-image.sh), configured as an operator's existing Prometheus that loads the fleet's
rules and targets where roles/monitoring installs them, and read back over its HTTP API.

The monitoring role reaches it as it would any Prometheus host; only creating and configuring the box
(the operator's side) goes through podman.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from driver import Box, podman

IMAGE = "localhost/specfleet-prometheus:bookworm"
RULES_DIR = "/etc/prometheus/rules"
TARGETS_FILE = "/etc/prometheus/file_sd/specfleet-vllm.yml"
CA_FILE = "/etc/prometheus/specfleet-ca.pem"


class PrometheusBox(Box):
    """Started by `with PrometheusBox(name, scrape_interval) as prometheus:`, removed on leaving."""

    def __init__(self, container: str, scrape_interval: str = "2s", ca: Path | None = None) -> None:
        """`ca`: a CA whose certificates the job trusts over https (a box's proxy with TLS)."""
        super().__init__(container)
        self.scrape_interval = scrape_interval
        self.ca = ca
        self.url = ""

    def __enter__(self) -> PrometheusBox:
        podman("rm", "-f", self.container, check=False)
        podman(
            "run",
            "-d",
            "--name",
            self.container,
            "--systemd=always",
            "-p",
            "127.0.0.1::9090",
            IMAGE,
            "/sbin/init",
        )
        self.url = "http://" + podman("port", self.container, "9090/tcp").stdout.split()[0]
        self.address = podman(
            "inspect", "-f", "{{.NetworkSettings.IPAddress}}", self.container
        ).stdout.strip()
        self.sh(f"mkdir -p {RULES_DIR} {Path(TARGETS_FILE).parent}")
        job = {"job_name": "specfleet-vllm", "file_sd_configs": [{"files": [TARGETS_FILE]}]}
        if self.ca:
            # As roles/monitoring's snippet has it (monitoring_tls_ca_file).
            self.write(CA_FILE, self.ca.read_text())
            job["tls_config"] = {"ca_file": CA_FILE}
        config = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "rule_files": [f"{RULES_DIR}/*.yml"],
            "scrape_configs": [job],
        }
        self.write("/etc/prometheus/prometheus.yml", yaml.safe_dump(config))
        self.sh("systemctl is-system-running --wait >/dev/null; systemctl restart prometheus", check=False)
        self.wait(lambda: self.get("/-/ready", raw=True) is not None, "Prometheus ready", 60)
        return self

    def __exit__(self, *exc) -> None:
        podman("rm", "-f", self.container, check=False)

    def inventory(self, path: Path, settings: dict, addresses: dict) -> Path:
        """An inventory with this box as the fleet's Prometheus host (monitoring.yml's prometheus_servers),
        the address it reaches each GPU box's server at (podman's network, not the SSH loopback), and its own
        address among those the GPU boxes' proxies let read /metrics (a container connection gives none)."""
        host = {"ansible_connection": "containers.podman.podman", "ansible_host": self.container}
        group = {"hosts": {self.container: host}, "vars": settings}
        boxes = {
            box: {"vllm_service_advertise_host": address, "vllm_service_metrics_sources": [self.address]}
            for box, address in addresses.items()
        }
        path.write_text(json.dumps({"all": {"hosts": boxes, "children": {"prometheus_servers": group}}}))
        return path

    def get(self, path: str, raw: bool = False):
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                body = response.read().decode()
        except OSError:
            return None
        return body if raw else json.loads(body)["data"]

    def query(self, expr: str) -> list:
        return self.get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["result"]

    @staticmethod
    def wait(condition, what: str, timeout: float):
        deadline = time.monotonic() + timeout
        while not (found := condition()):
            assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
            time.sleep(2)
        return found
