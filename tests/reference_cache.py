"""One computation per distinct fault-free reference in a test session.

Many integration modules compare a recovered run with the same standalone reference (the
example's 40 steps on 3 ranks is shared by six modules, and some modules ask for one
reference twice); each costs three interpreters importing torch and a full run. Kept in
this module, which is always imported as ``tests.reference_cache``, because the helpers
that use it are imported under two names by the test modules.

The key is what decides the result: the command (a script argument by its content, so a
copy of a script in a test's tmp directory is the same reference), the world size, and
each rank's added and removed environment.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Hashable
from pathlib import Path

_LOCK = threading.Lock()
_DIGESTS: dict[Hashable, str] = {}


def argv_key(argv: list[str]) -> tuple[str, ...]:
    out = []
    for arg in argv[1:]:  # argv[0] is the interpreter, the same for the whole session
        path = Path(arg)
        if arg.endswith(".py") and path.is_file():
            out.append("sha256:" + hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            out.append(arg)
    return tuple(out)


def cached(key: Hashable, compute: Callable[[], str]) -> str:
    """The digest for ``key``, computed by ``compute`` the first time it is asked for. A
    failed computation is not kept: the next test asking for it runs it again."""
    with _LOCK:
        if key in _DIGESTS:
            return _DIGESTS[key]
        digest = compute()
        _DIGESTS[key] = digest
        return digest
