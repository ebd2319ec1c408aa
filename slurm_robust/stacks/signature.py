"""Normalised stack signatures of a rank, at several levels of detail.

Two ranks doing the same thing must get the same signature, so normalisation drops
what differs between healthy ranks: native addresses, thread ids and names, the
process state, and (optionally) line numbers. Python function names are reduced to
their last dotted part because py-spy prints qualified names (``Thread.run``) and
faulthandler bare ones (``run``), and a capture may mix both.

Levels, coarsest first (the analyzer tries them in this order):

``user``
    per process, the innermost frame in the user's code (not the standard library or
    site-packages) and the name of the function it is calling;
``top``
    per process, the innermost ``top_n`` Python frames of the main thread;
``main``
    per process, the whole main-thread stack, native frames included;
``full``
    per process, the set of all its threads' stacks.

A rank's signature is its worker's key followed by the sorted distinct keys of its
child processes. Children that ended during the capture or are not Python (a shell, a
compiler) are left out: they come and go on healthy ranks too. A worker that could not
be dumped gets ``<no stack: KIND>``; a rank with no dump at all ``<missing>``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_robust.stacks.dumps import Frame, ProcessDump, RankDump, ThreadStack, is_address

LEVELS: tuple[str, ...] = ("user", "top", "main", "full")

# Paths of code that is not the user's: the standard library, installed packages,
# frozen modules. Matched against full paths (py-spy --full-filenames, faulthandler).
DEFAULT_LIBRARY_PATTERN = (r"/(site|dist)-packages/|/lib/python\d+(\.\d+)?/|^<frozen |^<string>$"
                           r"|^<stdin>$")

MISSING = ("<missing>",)

Key = tuple[object, ...]


@dataclass(frozen=True)
class SignatureOptions:
    """How stacks are normalised.

    keep_lines: keep line numbers (drop them to match ranks running slightly different
        code, e.g. after a hot update on some nodes).
    top_n: frames kept at the ``top`` level.
    library_pattern: regex on a frame's file marking it as not the user's code.
    """

    keep_lines: bool = True
    top_n: int = 3
    library_pattern: str = DEFAULT_LIBRARY_PATTERN


class Signer:
    """Computes signatures; caches the user/library decision per file path."""

    def __init__(self, options: SignatureOptions | None = None) -> None:
        self.options = options or SignatureOptions()
        self._library = re.compile(self.options.library_pattern)
        self._is_user: dict[str, bool] = {}

    def rank_signature(self, dump: RankDump | None, level: str) -> Key:
        if dump is None:
            return MISSING
        worker = dump.worker
        if worker is None:
            return ("<no worker process>",)
        children = {self.process_key(p, level) for p in dump.processes
                    if p.role != "worker" and p.error not in ("gone", "not_python")}
        return (self.process_key(worker, level), *sorted(children, key=repr))

    def process_key(self, proc: ProcessDump, level: str) -> Key:
        if proc.error is not None:
            return (f"<no stack: {proc.error}>",)
        if level == "full":
            stacks = {self._stack_key(t.frames, native=True) for t in proc.threads}
            return tuple(sorted(stacks, key=repr))
        main = proc.main_thread()
        if main is None:
            return ("<no threads>",)
        if level == "main":
            return self._stack_key(main.frames, native=True)
        python = [f for f in main.frames if not f.native]
        if level == "top":
            return self._stack_key(python[: self.options.top_n], native=False)
        if level == "user":
            return self._user_key(python)
        raise ValueError(f"unknown signature level {level!r}; expected one of {LEVELS}")

    def _user_key(self, python: Sequence[Frame]) -> Key:
        for index, frame in enumerate(python):
            if self.is_user(frame.file):
                callee = _short(python[index - 1].name) if index > 0 else ""
                return (*self._frame_key(frame), callee)
        # No user frame (an idle library worker): its innermost Python frame stands in.
        return self._frame_key(python[0]) if python else ("<no python frames>",)

    def _stack_key(self, frames: Sequence[Frame], native: bool) -> Key:
        return tuple(self._frame_key(f) for f in frames
                     if (native or not f.native) and not is_address(f.name))

    def _frame_key(self, frame: Frame) -> tuple[object, ...]:
        if frame.native:
            return (frame.name, frame.file.rsplit("/", 1)[-1])
        line = frame.line if self.options.keep_lines else 0
        return (_short(frame.name), frame.file, line)

    def is_user(self, file: str) -> bool:
        known = self._is_user.get(file)
        if known is None:
            known = self._is_user[file] = not self._library.search(file)
        return known


def _short(name: str) -> str:
    # "_exception_logger.<locals>.wrapper" -> "wrapper"; "Thread.run" -> "run".
    return name.rsplit(".", 1)[-1] if "." in name and not name.startswith("<") else name


def format_frames(thread: ThreadStack | None, limit: int = 8) -> list[str]:
    """The innermost ``limit`` frames of a thread as ``func (file:line)`` strings.

    Python frames only, when the thread has any (they are what people read first);
    otherwise its native frames, without bare addresses.
    """
    if thread is None:
        return []
    python = [f for f in thread.frames if not f.native]
    frames = python or [f for f in thread.frames if not is_address(f.name)]
    return [f"{f.name} ({f.file})" if f.native else f"{f.name} ({f.file}:{f.line})"
            for f in frames[:limit]]
