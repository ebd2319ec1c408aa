"""wait_for_store: a non-zero rank waits for rank 0's store to listen, then goes on."""

from __future__ import annotations

import socket
import threading
import time

from slurm_robust.store_wait import wait_for_store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_waits_until_the_store_listens() -> None:
    port = _free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_late() -> None:
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen()

    t = threading.Thread(target=listen_late)
    t.start()
    try:
        env = {"RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        waited = wait_for_store(env, timeout_s=10)
        assert 0.25 <= waited < 10
        conn, _ = server.accept()  # the probe really connected
        conn.close()
    finally:
        t.join()
        server.close()


def test_gives_up_after_the_timeout_without_raising() -> None:
    env = {"RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    waited = wait_for_store(env, timeout_s=0.2)
    assert 0.2 <= waited < 2


def test_rank0_agent_store_and_bad_input_do_not_wait() -> None:
    port = str(_free_port())  # nothing listens: any wait would last the timeout
    for env in ({"RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
                {"RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                 "TORCHELASTIC_USE_AGENT_STORE": "True"},
                {"RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "x"},
                {"RANK": "x", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
                {"RANK": "1", "MASTER_PORT": port}):
        assert wait_for_store(env, timeout_s=5) == 0.0
