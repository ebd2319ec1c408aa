"""Built-in checks, registered on import (in this order, which is the run order).

- ``gpu``: nvml_responsive, gpu_count, gpu_xid, gpu_ecc, gpu_remap, gpu_thermal, gpu_pcie,
  gpu_nvlink, gpu_procs (quick and deep suites);
- ``host``: host_disk_free, host_mem_available (quick and deep), host_stray_procs,
  host_stale_lock (quick);
- ``network``: net_ib_ports, net_eth_links (quick and deep);
- ``deep``: deep_matmul, deep_membw, deep_collective (deep suite);
- ``storage``: deep_disk_io, deep_shm_free, deep_mounts (deep suite);
- ``dcgm``: dcgm_diag, NVIDIA's diagnostic at the stage's level where dcgmi exists (deep
  suite, last: its levels take seconds to a quarter of an hour).

A site's own checks: a module using :func:`slurm_robust.health.check`, named in the site
config as ``"checks": {"site_modules": ["mysite.checks"]}``.
"""

# Import order is run order: cheap GPU and host readings first, so a node with a bad GPU
# fails before the seconds-long deep tests run. Plain imports (not a loop over names) so
# the import-graph test sees them; isort must not reorder them.
# isort: off
from slurm_robust.health.checks import gpu  # noqa: F401
from slurm_robust.health.checks import host  # noqa: F401
from slurm_robust.health.checks import network  # noqa: F401
from slurm_robust.health.checks import deep  # noqa: F401
from slurm_robust.health.checks import storage  # noqa: F401
from slurm_robust.health.checks import dcgm  # noqa: F401
# isort: on

MODULES = ("gpu", "host", "network", "deep", "storage", "dcgm")
