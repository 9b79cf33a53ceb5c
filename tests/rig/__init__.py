"""Moved to harness/rig/ (benchmarks share it); kept so `tests.rig.*` still names the same modules."""
import sys

import harness.rig
from harness.rig import availability, blackhole, keys, procs, rootfs, sshd, systemd_host

sys.modules[__name__] = harness.rig
for _m in (availability, blackhole, keys, procs, rootfs, sshd, systemd_host):
    sys.modules[f"{__name__}.{_m.__name__.rsplit('.', 1)[1]}"] = _m
