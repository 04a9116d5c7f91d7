#!/usr/bin/python
"""Documentation of the release_transfer action (action_plugins/release_transfer.py): it runs
ansible.posix.synchronize's action, no module of its own."""

from __future__ import annotations

DOCUMENTATION = r"""
module: release_transfer
short_description: Copy a directory from the controller to a box with rsync, showing progress while it runs
description:
  - Runs M(ansible.posix.synchronize) with every option given to it except its own two, and while rsync
    runs prints one line every O(progress_interval_s) seconds at default verbosity, where the transfer moved
    on since the last - the files and bytes written so far, of O(total_bytes), and the rate - for
    transfers of many gigabytes (a model's weights, a drafter) that would otherwise show nothing until
    they end.
  - Progress is counted from rsync's own log (C(--log-file), one line per file it wrote, with its length);
    a line comes as each file is complete, so a single large file shows once it is whole. Files rsync
    skips (already whole on the box, an interrupted transfer resumed) are not counted.
  - In check mode rsync runs dry and nothing is counted.
options:
  total_bytes:
    description: The size of what is transferred, for the share done in each line; 0 shows bytes alone.
    type: int
    default: 0
  progress_interval_s:
    description: Seconds between progress lines. Was progress_interval (still taken).
    aliases: [progress_interval]
    type: int
    default: 30
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - Every option of M(ansible.posix.synchronize) is accepted and passed on; C(rsync_opts) gets the log's two
    options added.
author:
  - specfleet maintainers
"""

EXAMPLES = r"""
- name: Ship the weights into the staging directory, with progress every minute
  release_transfer:
    src: /data/models/Kimi-K2.5/
    dest: /models/releases/w1.partial/
    recursive: true
    partial: true
    total_bytes: 550000000000
    progress_interval_s: 60
"""

RETURN = r"""
progress:
  description:
    - What was written by each progress line's time, and at the end (the last entry); C(seconds) from the
      transfer's start.
  returned: always
  type: list
  elements: dict
  sample:
    - {"seconds": 30.0, "files": 4, "bytes": 34359738368}
    - {"seconds": 512.3, "files": 64, "bytes": 549755813888}
transferred:
  description: The last line, as the progress lines read.
  returned: always
  type: str
  sample: "pcie-box-01: 64 file(s), 512.00 GB of 512.00 GB (100%) in 512 s, 1.00 GB/s"
cmd:
  description: The rsync command line M(ansible.posix.synchronize) ran.
  returned: always
  type: str
  sample: rsync --delay-updates -F --archive /data/w/ deploy@10.20.0.11:/models/releases/w1.partial/
"""
