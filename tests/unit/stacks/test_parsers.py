"""Parsers of py-spy and faulthandler output, on recorded strings, and the JSON form."""

from __future__ import annotations

import faulthandler
import json
import threading

import pytest

from slurm_robust.stacks.dumps import (
    ProcessDump,
    RankDump,
    StackDumpError,
    classify_pyspy_error,
    parse_faulthandler,
    parse_pyspy,
    rank_dump_from_json,
    rank_dump_to_json,
    read_capture,
    write_rank_dump,
)

# py-spy 0.4.3 `dump --pid P --full-filenames` of a rank waiting in a gloo all_reduce.
PYSPY_PLAIN = """\
Process 5821: /work/main/.venv/bin/python g.py 0
Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)

Thread 5821 (idle): "MainThread"
    all_reduce (/work/main/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252)
    _exception_logger.<locals>.wrapper (/work/main/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83)
    <module> (/tmp/srst/g.py:11)
Thread 5823 (idle): "worker-x"
    inner (/tmp/sr_t.py:2)
    Thread.run (/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py:982)
        Arguments:
            self: <Thread at 0x7fc15f628850>
"""  # noqa: E501

# The same with --native (one pybind11 name shortened; real ones hold parentheses too).
PYSPY_NATIVE = """\
Process 5821: /work/main/.venv/bin/python g.py 0
Python v3.11.7 (/root/.pyenv/versions/3.11.7/bin/python3.11)

Thread 5821 (idle): "MainThread"
    0x7f2e720a3f16 (/usr/lib/x86_64-linux-gnu/libc.so.6)
    pthread_cond_wait (/usr/lib/x86_64-linux-gnu/libc.so.6)
    c10d::Work::wait (/work/main/.venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so)
    pybind11::cpp_function::initialize<bool (*)(c10d::Work*, std::chrono::duration<long, std::ratio<(long)1, (long)1000> >)>::{lambda(pybind11::detail::function_call&)#1}::_FUN (/work/main/.venv/lib/python3.11/site-packages/torch/lib/libtorch_python.so)
    all_reduce (/work/main/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252)
    <module> (/tmp/srst/g.py:11)
    0x7f2e7204524a (/usr/lib/x86_64-linux-gnu/libc.so.6)
"""  # noqa: E501

# faulthandler (Python 3.11) after SIGUSR2, all_threads=True.
FAULTHANDLER = """\
Thread 0x00007f2e61ffb6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f2e727d5b80 (most recent call first):
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/tmp/srst/g.py", line 11 in <module>
"""  # noqa: E501


def test_pyspy_plain_threads_frames_and_main():
    threads = parse_pyspy(PYSPY_PLAIN)
    assert [t.name for t in threads] == ["MainThread", "worker-x"]
    main = threads[0]
    assert main.main and main.tid == 5821 and main.state == "idle"
    assert [(f.name, f.line) for f in main.frames] == [
        ("all_reduce", 3252), ("_exception_logger.<locals>.wrapper", 83), ("<module>", 11)]
    assert main.frames[2].file == "/tmp/srst/g.py" and not main.frames[2].native
    # --locals detail lines are not frames.
    assert [f.name for f in threads[1].frames] == ["inner", "Thread.run"]
    assert not threads[1].main


def test_pyspy_native_frames_keep_names_with_parentheses():
    (main,) = parse_pyspy(PYSPY_NATIVE)
    natives = [f for f in main.frames if f.native]
    assert natives[0].name == "0x7f2e720a3f16"
    assert natives[1].name == "pthread_cond_wait"
    assert natives[1].file == "/usr/lib/x86_64-linux-gnu/libc.so.6"
    assert natives[3].name.startswith("pybind11::cpp_function::initialize<bool (*)")
    assert natives[3].file.endswith("libtorch_python.so")
    assert [f.name for f in main.frames if not f.native] == ["all_reduce", "<module>"]


def test_pyspy_main_thread_found_by_pid_when_unnamed():
    text = "Thread 77 (active+gil)\n    f (/x.py:1)\nThread 78 (idle)\n    g (/x.py:2)\n"
    threads = parse_pyspy(text, pid=77)
    assert [t.main for t in threads] == [True, False]


def test_faulthandler_recorded_output():
    threads = parse_faulthandler(FAULTHANDLER)
    assert len(threads) == 2
    assert [f.name for f in threads[1].frames] == ["all_reduce", "wrapper", "<module>"]
    assert threads[1].main and not threads[0].main
    assert threads[0].frames[0].line == 324


def test_faulthandler_live_output_of_this_process(tmp_path):
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="waiter")
    thread.start()
    try:
        path = tmp_path / "fh.txt"
        with open(path, "w") as fh:
            faulthandler.dump_traceback(fh, all_threads=True)
    finally:
        stop.set()
        thread.join()
    threads = parse_faulthandler(path.read_text())
    assert len(threads) >= 2
    main = next(t for t in threads if t.main)
    names = [f.name for f in main.frames]
    assert "test_faulthandler_live_output_of_this_process" in names
    waiter = [t for t in threads if any(f.name == "wait" for f in t.frames)]
    assert waiter and not waiter[0].main


@pytest.mark.parametrize("stderr,kind", [
    ("Error: Failed to get process executable name. Check that the process is running.\n"
     "Caused by:\n    0: Permission denied (os error 13)", "permission"),
    ("Error: Failed to get process executable name. Check that the process is running.\n"
     "Caused by:\n    0: No such file or directory (os error 2)", "gone"),
    ("Error: Failed to find python version from target process", "not_python"),
    ("Error: something new", "error"),
])
def test_classify_pyspy_errors(stderr, kind):
    assert classify_pyspy_error(stderr) == kind


def test_json_round_trip_and_capture_reader(tmp_path):
    worker = ProcessDump(pid=5821, ppid=1, role="worker", method="py-spy",
                         threads=parse_pyspy(PYSPY_NATIVE), cmdline="python g.py 0")
    child = ProcessDump(pid=5900, ppid=5821, role="child", method="py-spy",
                        error="gone", message="process ended")
    dump = RankDump(rank=3, node="node2", pid=5821, time=12.5, processes=[worker, child],
                    capture_id="c1")
    again = rank_dump_from_json(json.loads(json.dumps(rank_dump_to_json(dump))))
    assert again == dump
    write_rank_dump(tmp_path, dump)
    assert (tmp_path / "rank3.json").exists()
    assert read_capture(tmp_path) == [dump]


def test_reader_names_the_bad_file(tmp_path):
    with pytest.raises(StackDumpError, match="no rank"):
        read_capture(tmp_path)
    (tmp_path / "rank0.json").write_text("{not json")
    with pytest.raises(StackDumpError, match="rank0.json"):
        read_capture(tmp_path)
    (tmp_path / "rank0.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(StackDumpError, match="not a stack dump"):
        read_capture(tmp_path)
