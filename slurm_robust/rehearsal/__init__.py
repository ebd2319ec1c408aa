"""Rehearsal tooling: benchmarks, synthetic data, workloads and fault injection.

Nothing a production node runs (prolog, epilog, agents, controller, workers) imports this
package; it exists for rehearsals on the mini-cluster, for the benchmarks that print JSON,
and for the tests.
"""
