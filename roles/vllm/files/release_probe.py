"""What the role needs to know of an installed release, in one call (run by the release's own Python).

argv: the completion marker, the package, then the distributions that must not be there. Prints JSON:
the package's version ("incomplete" without the marker), the virtualenv's site-packages, which of those
distributions are present, and the version of the "vllm" alias distribution (none without it).
"""

import importlib.metadata
import json
import os
import sys
import sysconfig


def version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


marker, package, *unwanted = sys.argv[1:]
print(
    json.dumps(
        {
            "version": version(package) if os.path.exists(marker) else "incomplete",
            "site_packages": sysconfig.get_paths()["purelib"],
            "unwanted": [name for name in unwanted if version(name) is not None],
            "alias": version("vllm"),
        }
    )
)
