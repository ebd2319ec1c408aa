"""The embedded Slurm mini-cluster: real Slurm daemons on localhost for tests and demos.

``slurm-robust cluster up|down|status``, the integration tests' ``minicluster`` fixture
(tests/conftest.py) and the demo drive :class:`.manager.MiniCluster`:

- :mod:`.config`: :class:`~.config.ClusterConfig`, where everything lives (one root
  directory for configs, state, logs, pid files and node-local directories) and which
  ports and node names the cluster uses;
- :mod:`.templates`: slurm.conf, slurmdbd.conf, plugstack.conf, the site config and the
  prolog/epilog wrappers, rendered as strings (pure);
- :mod:`.daemons`: start and stop munged, mariadb, slurmdbd, slurmctld and one slurmd per
  node, each tracked by a pid file and a marker in its environment;
- :mod:`.manager`: ``up`` (idempotent), ``down`` (cancels jobs, stops exactly what it
  started) and ``status``.
- :mod:`.cli`: ``slurm-robust cluster ...``, which the library's CLI reaches by name
  (slurm_robust/cli/main.py) since this package is rehearsal tooling it never imports.

Every node is this host, so "losing a node" (stop its slurmd, kill its processes, wipe its
node-local directories) is a faithful rehearsal on one machine.
"""
