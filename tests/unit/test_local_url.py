"""local_url (filter_plugins/local_url.py): where the box itself reaches a server bound to a host."""

from pathlib import Path

import pytest
from script_module import call_apart

FILTER = Path(__file__).resolve().parents[2] / "filter_plugins/local_url.py"


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [
        ("0.0.0.0", 8000, "http://127.0.0.1:8000"),
        ("", "8000", "http://127.0.0.1:8000"),
        ("::", 8000, "http://[::1]:8000"),
        # Bound to one address, the server does not answer on 127.0.0.1.
        ("10.20.0.5", 8000, "http://10.20.0.5:8000"),
        ("fd00::5", 8443, "http://[fd00::5]:8443"),
        ("[fd00::5]", 8443, "http://[fd00::5]:8443"),
        ("box-01.internal", 8000, "http://box-01.internal:8000"),
    ],
)
def test_where_the_box_reaches_its_server(host, port, url):
    assert call_apart(FILTER, "local_url", [host, port]) == [{"answer": url}]
