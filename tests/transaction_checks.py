"""What every failed change must end with (roles/transaction's rollback), read from a run's results."""

from driver import SECOND_BOX, Run

ROLLBACK = {"role": "transaction", "file": "transaction/tasks/rollback.yml"}
RESTART = {"role": "vllm_service", "file": "vllm_service/tasks/restart.yml"}
UNIT = "/etc/systemd/system/vllm.service"
RECORD = "/var/lib/specfleet/last_good"


def assert_restored(run: Run, box, host: str, changed: list[str], speculation_off: bool = False) -> str:
    """The run failed on `host`, put back exactly `changed` from the last known good, restarted on it
    and saw a real completion after that restart, then one through the proxy; the unit and the proxy's site
    on disk are the recorded ones; the host failed with one line saying so (`speculation_off`: that it
    serves without speculation, as the record says), and the second box was never reached. Returns that
    line."""
    assert not run.ok, str(run)
    restore = run.one(host=host, action="last_good", **ROLLBACK)
    assert restore.changed and restore.result["restored"] == changed, str(run)
    [restart] = run.changed_results(host=host, action="systemd_service", **RESTART)
    # The readiness check answers ok only once the server also answered a real completion.
    ready = {"role": "vllm_service", "file": "vllm_service/tasks/ready.yml", "action": "script"}
    completions = run.ran(host=host, status="ok", **ready)
    assert completions, str(run)
    # And then the clients' path, through the proxy's site as recorded (roles/vllm_proxy's check).
    clients = run.ran(
        host=host, status="ok", role="vllm_proxy", file="vllm_proxy/tasks/ready.yml", action="script"
    )
    assert clients, str(run)
    order = [run.results.index(result) for result in (restore, restart, completions[-1], clients[-1])]
    assert order == sorted(order), (
        f"no completion after the restore's restart, or none through the proxy\n{run}"
    )
    box.sh(f"cmp {UNIT} {RECORD}/files/unit")
    box.sh(f"cmp /etc/nginx/conf.d/specfleet-vllm.conf {RECORD}/files/proxy")
    line = run.failures(host)[-1]
    assert "\n" not in line, line
    serves = " without speculation (the spec watcher's fallback, as recorded)" if speculation_off else ""
    assert line.endswith(f", which serves{serves} and answered a completion, through the proxy too"), line
    assert not run.touched(SECOND_BOX), str(run)
    return line
