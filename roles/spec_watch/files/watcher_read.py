"""What roles/spec_watch reads of the box in one call (python3 -c, from tasks/main.yml): the watcher's
account (only a watcher that acted leaves one), the drafter that serves now, and whether its timer is
installed. One JSON line."""

import json
import os
import sys

account, current, timer = sys.argv[1:]
acted = None
if os.path.exists(account):
    with open(account) as source:
        acted = json.load(source)
print(
    json.dumps(
        {
            "acted": acted,
            "drafter": os.path.realpath(current) if os.path.islink(current) else "",
            "installed": os.path.exists(timer),
        }
    )
)
