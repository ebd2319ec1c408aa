"""The failure corpus's frozen development / held-out split.

An entry is held out iff the first byte of sha256 of its thread URL is below 0x4d (77 of
256 values, about 30 %). The rule depends on nothing a pattern writer can see or choose
after reading an entry: it was fixed before any entry was sorted by it, it never moves an
entry from one split to the other, and a new entry's split is known the moment its URL is.
Classifier patterns are written from development entries only; the held-out figure is the
one quoted.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

HELD_OUT_BELOW = 0x4D


class Split(StrEnum):
    DEVELOPMENT = "development"
    HELD_OUT = "held_out"


def split_of(url: str) -> Split:
    """The split of the corpus entry whose thread is ``url`` (the URL exactly as stored)."""
    if not url:
        raise ValueError("a corpus entry without a URL has no split; every entry needs its "
                         "thread's URL")
    first = hashlib.sha256(url.encode("utf-8")).digest()[0]
    return Split.HELD_OUT if first < HELD_OUT_BELOW else Split.DEVELOPMENT
