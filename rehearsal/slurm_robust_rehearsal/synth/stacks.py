"""Synthetic captures: realistic-looking dumps of a training job, with chosen faults.

Used by the benchmark (10,000 ranks) and the analyzer's tests. Each rank gets a worker
process with a main thread about 20 frames deep (a training loop calling into torch
down to the gloo wait, native frames included), a background thread, and one
data-loader child waiting for work. ``faults`` changes what chosen ranks are doing:

``blocked``     main thread stopped in user code outside the collective (a sleep)
``all_gather``  / ``isend`` / ``irecv``: waiting in another collective (ByteRobust Fig. 7)
``loader``      the data-loader child stuck in ``__getitem__``; the worker waits for it
``native``      same Python stack, a different native frame (stuck in a kernel call)
``timeout``     the dump itself failed (py-spy did not answer)
``wrapper``     healthy variation: still in the Python wrapper of the all-reduce

A fault name not listed raises ValueError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from slurm_robust.layout import ParallelLayout
from slurm_robust.stacks.dumps import Frame, ProcessDump, RankDump, ThreadStack

SITE = "/opt/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
TRAIN = "/home/user/project/train.py"
MODEL = "/home/user/project/model.py"


def _py(name: str, file: str, line: int) -> Frame:
    return Frame(name, file, line, False)


def _nat(name: str, lib: str) -> Frame:
    return Frame(name, lib, 0, True)


_OUTER = [_py("train_step", TRAIN, 88), _py("train", TRAIN, 140), _py("main", TRAIN, 201),
          _py("<module>", TRAIN, 210), _nat("0x7f0000001234", "libc.so.6")]
_COLLECTIVE_PY = [_py("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 3252),
                  _py("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83)]
_WAIT_NATIVE = [_nat("0x7f00000a3f16", "libc.so.6"), _nat("pthread_cond_wait", "libc.so.6"),
                _nat("std::condition_variable::wait", "libstdc++.so.6"),
                _nat("c10d::Work::wait", "libtorch_cpu.so"),
                _nat("pybind11::cpp_function::dispatcher", "libtorch_python.so")]
_MODEL = [_py("forward", MODEL, 41), _py("_call_impl", f"{SITE}/torch/nn/modules/module.py",
                                          1747)]
_BACKGROUND = [_py("wait", f"{STDLIB}/threading.py", 324),
               _py("heartbeat", "/home/user/project/monitor.py", 22),
               _py("run", f"{STDLIB}/threading.py", 982),
               _py("_bootstrap_inner", f"{STDLIB}/threading.py", 1045),
               _py("_bootstrap", f"{STDLIB}/threading.py", 1002)]
_LOADER_IDLE = [_py("select", f"{STDLIB}/selectors.py", 415),
                _py("wait", f"{STDLIB}/multiprocessing/connection.py", 947),
                _py("poll", f"{STDLIB}/multiprocessing/connection.py", 257),
                _py("get", f"{STDLIB}/multiprocessing/queues.py", 113),
                _py("_worker_loop", f"{SITE}/torch/utils/data/_utils/worker.py", 298),
                _py("run", f"{STDLIB}/multiprocessing/process.py", 108),
                _py("_bootstrap", f"{STDLIB}/multiprocessing/process.py", 314)]
_LOADER_STUCK = [_py("__getitem__", "/home/user/project/data.py", 57),
                 _py("fetch", f"{SITE}/torch/utils/data/_utils/fetch.py", 52),
                 *_LOADER_IDLE[4:]]


def _collective(name: str, line: int) -> list[Frame]:
    return [*_WAIT_NATIVE, _py(name, f"{SITE}/torch/distributed/distributed_c10d.py", line),
            _COLLECTIVE_PY[1], *_OUTER]


def _main_frames(fault: str | None) -> list[Frame]:
    if fault is None:
        return [*_WAIT_NATIVE, *_COLLECTIVE_PY, *_OUTER]
    if fault == "blocked":
        return [_nat("clock_nanosleep", "libc.so.6"), _py("train_step", TRAIN, 86),
                *_OUTER[1:]]
    if fault == "all_gather":
        return _collective("all_gather_into_tensor", 3790)
    if fault == "isend":
        return _collective("isend", 2390)
    if fault == "irecv":
        return _collective("irecv", 2432)
    if fault == "loader":
        return [_py("get", f"{STDLIB}/multiprocessing/queues.py", 113),
                _py("_next_data", f"{SITE}/torch/utils/data/dataloader.py", 1448),
                _py("__next__", f"{SITE}/torch/utils/data/dataloader.py", 733),
                _py("train", TRAIN, 131), *_OUTER[2:]]
    if fault == "native":
        return [_nat("ioctl", "libc.so.6"), *_WAIT_NATIVE[2:], *_COLLECTIVE_PY, *_OUTER]
    if fault == "wrapper":
        return [_py("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 79), *_OUTER]
    if fault == "timeout":
        return []
    raise ValueError(f"unknown synthetic fault {fault!r}")


def synthetic_rank(rank: int, node: str, fault: str | None = None,
                   now: float = 0.0) -> RankDump:
    """One rank's dump with an optional fault (see the module doc)."""
    pid = 10_000 + rank * 2
    main = ThreadStack(pid, "MainThread", _main_frames(fault), main=True)
    background = ThreadStack(pid + 100_000, "monitor", list(_BACKGROUND))
    worker = ProcessDump(pid=pid, ppid=1, role="worker", method="py-spy",
                         threads=[main, background])
    if fault == "timeout":
        worker.threads, worker.error, worker.message = [], "timeout", "py-spy did not answer"
    child_frames = _LOADER_STUCK if fault == "loader" else _LOADER_IDLE
    child = ProcessDump(pid=pid + 1, ppid=pid, role="child", method="py-spy",
                        threads=[ThreadStack(pid + 1, "MainThread", list(child_frames),
                                             main=True)])
    return RankDump(rank=rank, node=node, pid=pid, time=now, processes=[worker, child],
                    capture_id="synthetic")


def synthetic_capture(layout: ParallelLayout, faults: Mapping[int, str] | None = None,
                      node_of: Callable[[int], str] | None = None) -> list[RankDump]:
    """A dump for every rank of ``layout``; ``faults`` maps rank -> fault name."""
    faults = faults or {}
    where = node_of or layout.node_of
    return [synthetic_rank(r, where(r), faults.get(r)) for r in range(layout.world_size)]
