"""A small GPT trained data-parallel, deterministic on CPU: the launcher's test workload.

Runs under the robust launcher (``slurm-robust submit --nodes 3 --spares 1 -- python
examples/train_gpt.py ...``) and also standalone in a plain torchrun-style environment
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), where it keeps its own ``torch.save``
checkpoints every ``--save-every`` steps in ``--ckpt-dir`` and resumes from them.

Determinism (the closing comparison of every fault test is the SHA-256 of the final
parameters): the data of step s on rank r comes from a generator seeded with (seed, s, r),
so a restored run replays exactly the batches it lost; the model
(:mod:`slurm_robust_rehearsal.workloads.gpt`) has no dropout; torch uses
one thread; gradients are averaged with ONE all-reduce over a flat vector in a fixed
order. (torch's DistributedDataParallel re-buckets its gradients after the first
iteration, so a run restarted mid-way would sum in a different order for one step and
drift in the last bits; the flat all-reduce is the same data-parallel algorithm without
that.) At the end it writes the digest into the event log (``run_end.params_sha256``).

Under NVIDIA's ``ft_launcher`` (nvidia-resiliency-ext; the ``ft_launcher`` arm of ``bench
recovery``) each rank also sends one heartbeat per step through its ``RankMonitorClient``,
as that launcher's users do; without ``ft_launcher`` or without the package nothing changes.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from slurm_robust import train
from slurm_robust_rehearsal.workloads.gpt import GPT, GPTConfig

#: What PyTorch prints for these CUDA errors (the RuntimeError text, with its usual
#: follow-up lines), keyed by the --cuda-fault choice.
_CUDA_HINT = ("CUDA kernel errors might be asynchronously reported at some other API call, "
              "so the stacktrace below might be incorrect.\n"
              "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.\n"
              "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
CUDA_FAULTS = {
    "device-assert": "CUDA error: device-side assert triggered\n" + _CUDA_HINT,
    "illegal-address": "CUDA error: an illegal memory access was encountered\n" + _CUDA_HINT,
}


#: Set by nvidia-resiliency-ext's ft_launcher in each worker (its rank monitor's socket).
FT_RANK_MONITOR_SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"


def cuda_fault(kind: str) -> RuntimeError:
    """The deliberate rehearsal fault of --cuda-fault (see parse)."""
    return RuntimeError(CUDA_FAULTS[kind])


def user_error(kind: str, step: int) -> None:
    """The deliberate user error of --user-error (see parse)."""
    message = f"sequence length must be positive, got -1 in batch of step {step}"
    if kind == "raise":
        raise ValueError(message)
    print(f"error: training aborted at step {step}: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--min-step-time", type=float, default=0.0,
                   help="pad each step to at least this many seconds (slows rehearsals)")
    p.add_argument("--first-step-time", type=float, default=0.0, metavar="S",
                   help="the first step of each start takes S seconds more (a stand-in "
                        "for a compilation or a data warm-up)")
    p.add_argument("--section", action="append", default=[], metavar="NAME:EVERY:SECONDS",
                   help="after every EVERY-th step, spend SECONDS in `run.section(NAME)` "
                        "(a stand-in for an evaluation or a save: hang detection gives "
                        "it its own limit; the parameters do not change). Repeatable")
    p.add_argument("--bug-at-step", type=int, default=None,
                   help="raise a TypeError at this step (a deliberate user-code error)")
    # Rehearsal flags: the script's own deliberate CUDA-like faults, raised on CPU with the
    # exact text PyTorch prints, so the launcher's classification and ladder can be
    # rehearsed without a GPU. Nothing else in the script changes.
    p.add_argument("--cuda-fault", choices=sorted(CUDA_FAULTS), default=None,
                   help="rehearsal: raise this CUDA error (as PyTorch words it) at "
                        "--cuda-fault-at; device-assert is the user's (an index out of "
                        "range in a kernel), illegal-address could be the code or the GPU")
    p.add_argument("--cuda-fault-at", type=int, default=None, help="step of --cuda-fault")
    p.add_argument("--cuda-fault-rank", type=int, default=None,
                   help="only this rank raises --cuda-fault (default: every rank)")
    # A user error at a step on one rank: "raise" is a plain ValueError with its traceback
    # (the classifier names it, user side); "exit" is the same error as a framework's
    # error handler reports it, one log line and exit status 1 (the classifier has no
    # more than the exit status: worker_signal, side unknown).
    p.add_argument("--user-error", choices=("raise", "exit"), default=None,
                   help="rehearsal: a ValueError at --user-error-at, raised or reported and "
                        "exited 1")
    p.add_argument("--user-error-at", type=int, default=None, help="step of --user-error")
    p.add_argument("--user-error-rank", type=int, default=None,
                   help="only this rank fails with --user-error (default: every rank)")
    p.add_argument("--save-every", type=int, default=0,
                   help="standalone only: torch.save a checkpoint every N steps")
    p.add_argument("--ckpt-dir", default=None, help="standalone checkpoint directory")
    p.add_argument("--ckpt-format", choices=("torch_save", "dcp_async"), default="torch_save",
                   help="standalone only: rank 0 torch.save, or every rank "
                        "torch.distributed.checkpoint.async_save (the torchrun+DCP peer)")
    p.add_argument("--progress-file", default=None,
                   help="standalone only: rank 0 appends 'STEP UNIXTIME' after each step "
                        "(how the plain-Slurm baseline of `bench recovery` follows a run)")
    p.add_argument("--skip-steps", default="",
                   help="comma-separated steps (1-based, as reported) whose batch is skipped: "
                        "the fault-free twin of a run whose --nan-policy skip dropped them")
    p.add_argument("--events", default=None,
                   help="standalone only: event log to write run_end into")
    return p.parse_args(argv)


def parse_section(text: str) -> tuple[str, int, float]:
    """``NAME:EVERY:SECONDS`` of --section."""
    try:
        name, every, seconds = text.rsplit(":", 2)
        if not name or int(every) < 1 or float(seconds) < 0:
            raise ValueError(text)
        return name, int(every), float(seconds)
    except ValueError:
        raise SystemExit(f"--section {text!r}: use NAME:EVERY:SECONDS, e.g. eval:200:60") \
            from None


def batch(args: argparse.Namespace, step: int, rank: int) -> torch.Tensor:
    """Sequences of a noisy affine recurrence (learnable), fixed by (seed, step, rank)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    v, n = args.vocab, args.seq + 1
    a = torch.randint(1, 8, (args.batch, 1), generator=g)
    b = torch.randint(0, v, (args.batch, 1), generator=g)
    x0 = torch.randint(0, v, (args.batch, 1), generator=g)
    steps = torch.arange(n).unsqueeze(0)
    seqs = (x0 + a * steps + b * (steps // 4)) % v
    noise = torch.rand(args.batch, n, generator=g) < 0.05
    return torch.where(noise, torch.randint(0, v, (args.batch, n), generator=g), seqs)


def average_gradients(params: list[nn.Parameter], world: int) -> None:
    if world == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        if p.grad is None:
            p.grad = g
        p.grad.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    _init_under_torchrun()
    run = train.init()
    model = GPT(GPTConfig(vocab=args.vocab, d_model=args.d_model, n_layers=args.layers,
                          n_heads=args.heads, seq=args.seq, dropout=0.0))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    ft_monitor = ft_launcher_client()
    start = run.restore(model, opt, sched)
    dcp_saver = DcpSaver(args) if not run.robust and args.ckpt_format == "dcp_async" else None
    if dcp_saver is not None:
        start = dcp_saver.load(model, opt, sched)
    elif not run.robust:
        start = load_own_checkpoint(args, model, opt, sched)
    params = list(model.parameters())
    skip = {int(s) for s in args.skip_steps.split(",") if s}
    sections = [parse_section(text) for text in args.section]
    for step in range(start, args.steps):
        t0 = time.time()
        if step + 1 in skip or run.should_skip(step + 1):
            # A batch dropped by the NaN policy: no update, the position moves on.
            run.step_end(step + 1, None, None, model, opt, sched, data_position=step + 1)
            continue
        if args.bug_at_step is not None and step + 1 == args.bug_at_step:
            _ = "step " + (step + 1)  # the deliberate user-code error: str + int
        if args.cuda_fault and step + 1 == args.cuda_fault_at and \
                args.cuda_fault_rank in (None, run.rank):
            raise cuda_fault(args.cuda_fault)
        if args.user_error and step + 1 == args.user_error_at and \
                args.user_error_rank in (None, run.rank):
            user_error(args.user_error, step + 1)
        if step == start and args.first_step_time > 0:
            time.sleep(args.first_step_time)  # the stand-in for a compilation
        # This rank's own work, timed for fail-slow detection; the all-reduce is not in
        # it (there a fast rank waits for a slow one).
        with run.busy():
            data = batch(args, step, run.rank)
            loss = model.loss(data)
            opt.zero_grad(set_to_none=False)
            loss.backward()
        # This rank's own loss and gradients, before the all-reduce spreads a NaN: the
        # incident then names the rank where it began.
        run.local_check(step + 1, loss, params, data_position=step)
        average_gradients(params, run.world_size)
        grad_norm = float(nn.utils.clip_grad_norm_(params, 1.0))
        run.before_update()
        opt.step()
        sched.step()
        run.step_end(step + 1, loss.item(), grad_norm, model, opt, sched,
                     data_position=step + 1)
        if not run.robust and args.save_every and (step + 1) % args.save_every == 0:
            if dcp_saver is not None:
                dcp_saver.save(step + 1, model, opt, sched)
            else:
                save_own_checkpoint(args, run.rank, step + 1, model, opt, sched)
        if args.progress_file and run.rank == 0:
            with open(args.progress_file, "a") as fh:
                fh.write(f"{step + 1} {time.time():.3f}\n")
        if ft_monitor is not None:
            ft_monitor.send_heartbeat()
        pad = args.min_step_time - (time.time() - t0)
        if pad > 0:
            time.sleep(pad)
        for name, every, seconds in sections:
            if (step + 1) % every == 0:
                with run.section(name):
                    time.sleep(seconds)
    if dcp_saver is not None:
        dcp_saver.wait()
    if ft_monitor is not None:
        ft_monitor.shutdown_workload_monitoring()
    digest = train.params_digest(model)
    if run.rank == 0:
        print(f"params_sha256={digest} steps={args.steps}", flush=True)
    run.finish(params_sha256=digest, events_path=args.events)
    return 0


def save_own_checkpoint(args: argparse.Namespace, rank: int, step: int, model: nn.Module,
                        opt: torch.optim.Optimizer, sched: object) -> None:
    """Rank 0 writes the (replicated) state atomically; plain torch.save."""
    if rank != 0 or not args.ckpt_dir:
        return
    path = Path(args.ckpt_dir) / "ckpt.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    # A random O_EXCL temp name (mkstemp): nothing planted at a fixed name is written.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ckpt.", suffix=".tmp")
    with os.fdopen(fd, "wb") as fh:
        torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict()}, fh)  # type: ignore[attr-defined]
    os.replace(tmp, path)


def load_own_checkpoint(args: argparse.Namespace, model: nn.Module,
                        opt: torch.optim.Optimizer, sched: object) -> int:
    if not args.ckpt_dir or not (Path(args.ckpt_dir) / "ckpt.pt").exists():
        return 0
    state = torch.load(Path(args.ckpt_dir) / "ckpt.pt", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])  # type: ignore[attr-defined]
    return int(state["step"])


def ft_launcher_client() -> Any | None:
    """The rank's heartbeat client when ft_launcher started it, else None.

    ft_launcher gives every worker the socket of its rank monitor in
    ``FT_RANK_MONITOR_IPC_SOCKET``; the package may be missing where the example runs
    under anything else (the robust launcher, torchrun, plain srun), and it is optional.
    """
    if not os.environ.get(FT_RANK_MONITOR_SOCKET_ENV):
        return None
    try:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    except ImportError:
        return None
    client = RankMonitorClient()
    client.init_workload_monitoring()
    return client


def _init_under_torchrun() -> None:
    """Under torchrun --max-restarts: a process group keyed by the restart count.

    The agent's store outlives a restart, and gloo reads its peers' addresses from it;
    without a per-restart prefix the new workers find the dead ones' addresses. Known
    limit: the agents do not agree on the restart count after a failure on one node (the
    failing node's agent counts it, the others do not), and the group then never forms.
    The benches run torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a store per
    round, hosted by rank 0's worker), where this function does nothing.
    """
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # Only torchrun's agent sets this; the robust launcher sets the restart count too but
    # gives every attempt its own rendezvous port.
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or count is None \
            or world == 1 or dist.is_initialized():
        return
    from datetime import timedelta

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          world_size=world, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"restart{count}/", store),
                            rank=int(os.environ["RANK"]), world_size=world)


class DcpSaver:
    """DCP ``async_save`` every ``--save-every`` steps into ``ckpt-dir/step_N``.

    As DCP's documentation asks, a save waits for the previous one first. A checkpoint
    counts once its ``.metadata`` exists (DCP writes it last); load takes the newest.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        if not args.ckpt_dir:
            raise SystemExit("--ckpt-format dcp_async needs --ckpt-dir")
        self.root = Path(args.ckpt_dir)
        self.future: object | None = None
        # DCP's async writes run a gloo collective of their own beside the training's.
        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None

    def _state(self, model: nn.Module, opt: torch.optim.Optimizer,
               sched: object, step: int) -> dict[str, object]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, opt_sd = get_state_dict(model, opt)
        return {"model": model_sd, "optim": opt_sd,
                "extra": {"step": torch.tensor(step),
                          "sched_epoch": torch.tensor(sched.last_epoch)}}  # type: ignore[attr-defined]

    def save(self, step: int, model: nn.Module, opt: torch.optim.Optimizer,
             sched: object) -> None:
        import torch.distributed.checkpoint as dcp

        self.wait()
        self.future = dcp.async_save(self._state(model, opt, sched, step),
                                     checkpoint_id=str(self.root / f"step_{step}"),
                                     process_group=self.group)

    def wait(self) -> None:
        if self.future is not None:
            self.future.result()  # type: ignore[attr-defined]
            self.future = None

    def load(self, model: nn.Module, opt: torch.optim.Optimizer, sched: object) -> int:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        done = sorted((int(p.name.split("_")[1]) for p in self.root.glob("step_*")
                       if (p / ".metadata").exists()), reverse=True)
        if not done:
            return 0
        state = self._state(model, opt, sched, 0)
        dcp.load(state, checkpoint_id=str(self.root / f"step_{done[0]}"),
                 process_group=self.group)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        sched.last_epoch = int(state["extra"]["sched_epoch"])  # type: ignore[attr-defined]
        sched._last_lr = [g["lr"] for g in opt.param_groups]  # type: ignore[attr-defined]
        return int(state["extra"]["step"])


if __name__ == "__main__":
    raise SystemExit(main())
