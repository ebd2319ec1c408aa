"""A tiny gloo all-reduce training loop that can be told to hang or to run slow.

Used by the stack-analysis tests, the benchmark and anyone rehearsing a hang::

    python -m slurm_robust_rehearsal.workloads.stacks_gloo --rank R --world 8 \\
        --store /tmp/x/store --ready-dir /tmp/x/ready --hang-rank 3 --hang-at 5 --hang-in main

Each rank runs ``all_reduce`` over a small tensor, fed by a DataLoader with one worker
process (so each rank has a data-loader child, as real jobs do). At step
``--hang-at`` the rank ``--hang-rank`` blocks *outside* the collective: ``main`` makes
its main process wait on a lock that is never released, ``loader`` makes its
data-loader worker sleep inside ``__getitem__``. The other ranks then wait inside the
all-reduce. Every rank touches ``<ready-dir>/rank<r>`` when it has finished step
``--hang-at - 1``, so a caller knows when the hang is (about to be) in place.

``--slow-rank`` with ``--slow-factor`` makes one rank's compute take longer; every rank
appends its per-step compute time to ``<ready-dir>/times-rank<r>.txt``.

The process ends itself after ``--max-seconds`` (SIGALRM), so a crashed test leaves
nothing running.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import signal
import threading
import time
from pathlib import Path

from slurm_robust.stacks.handler import install_stack_dump_handler


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True, help="file for torch's FileStore rendezvous")
    p.add_argument("--ready-dir", required=True)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-at", type=int, default=5)
    p.add_argument("--hang-in", choices=("main", "loader"), default="main")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=2.0)
    p.add_argument("--compute-s", type=float, default=0.0)
    p.add_argument("--loader-workers", type=int, default=1)
    p.add_argument("--faulthandler", default="", help="install_stack_dump_handler template")
    p.add_argument("--max-seconds", type=int, default=120)
    return p.parse_args(argv)


class _Dataset:
    """Index -> small tensor; blocks forever at ``hang_index`` when asked to."""

    def __init__(self, hang_index: int | None) -> None:
        self.hang_index = hang_index

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int):  # noqa: ANN204 - torch tensor
        import torch

        if index == self.hang_index:
            _sleep_forever_in_loader()
        return torch.full((4,), float(index))


def _sleep_forever_in_loader() -> None:
    while True:
        time.sleep(3600)


def _arm_alarm(seconds: int, _worker_id: int = 0) -> None:
    # An alarm is not inherited across fork: each data-loader worker arms its own, so
    # a worker stuck in __getitem__ still ends when its parent is killed.
    signal.alarm(seconds)


def _block_outside_collective(lock: threading.Lock) -> None:
    lock.acquire()
    lock.acquire()  # never released: the rank stops here, outside any collective


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    signal.alarm(args.max_seconds)
    if args.faulthandler:
        install_stack_dump_handler(args.faulthandler)
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=args.rank,
                            world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.max_seconds))
    hang = args.rank == args.hang_rank
    dataset = _Dataset(args.hang_at if hang and args.hang_in == "loader" else None)
    loader = DataLoader(dataset, batch_size=None, num_workers=args.loader_workers,
                        worker_init_fn=functools.partial(_arm_alarm, args.max_seconds))
    ready = Path(args.ready_dir)
    times = open(ready / f"times-rank{args.rank}.txt", "a", buffering=1)  # noqa: SIM115
    factor = args.slow_factor if args.rank == args.slow_rank else 1.0
    lock = threading.Lock()
    for step, batch in enumerate(loader):
        if step == args.hang_at and hang and args.hang_in == "main":
            _block_outside_collective(lock)
        began = time.perf_counter()
        if args.compute_s:
            time.sleep(args.compute_s * factor)
        times.write(f"{step} {time.perf_counter() - began:.6f}\n")
        dist.all_reduce(batch)
        if step + 1 == args.hang_at:
            (ready / f"rank{args.rank}").touch()
        if step + 1 >= args.steps:
            break
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
