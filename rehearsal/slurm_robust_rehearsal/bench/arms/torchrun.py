"""The torchrun peer: ``sbatch`` + ``srun torchrun --max-restarts=3`` (c10d rendezvous,
one agent per node), the example saving with DCP ``async_save`` every ``--save-every``
steps; the elastic agents restart every worker in the job, which reload the newest DCP
checkpoint (in-job restart, state from disk). ``bench ettr --arm torchrun`` runs the same
peer on a fault schedule (bench/ettr_torchrun.py)."""

from __future__ import annotations

from typing import Any

from slurm_robust_rehearsal.bench.arms.base import TORCHRUN_MAX_RESTARTS, EttrRun, RecoveryRun
from slurm_robust_rehearsal.bench.arms.peers import PeerBase, elastic_worker, torchrun_script


class Torchrun(PeerBase):
    label = "torchrun_max_restarts_dcp_async_save"
    speedup_key = "vs_torchrun_dcp"
    port_offset = 500

    def script(self, run: RecoveryRun, port: int, worker: list[str]) -> str:
        return torchrun_script(run.args.nodes, TORCHRUN_MAX_RESTARTS, port, "bench",
                               elastic_worker(worker))

    def ettr(self, run: EttrRun) -> dict[str, Any]:
        """``bench ettr`` with this arm: the same fault schedule on this peer."""
        from slurm_robust_rehearsal.bench.ettr_torchrun import report

        return report(run, self.label)
