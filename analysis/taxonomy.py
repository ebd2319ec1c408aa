"""Incident taxonomy and recovery rungs, as docs/SCHEMAS.md names them.

The classes are slurm_robust.taxonomy's table (ByteRobust Table 1 plus the user-code and
launcher classes), so loaders give every class column the same categorical dtype and the
report lists every class, by its own name and category, even when it never occurred.
Records are read through :func:`read_class`: legacy names map to their class, and a
record whose class is unknown or whose category contradicts its class is unread input
(counted with the reason), never merged into a neighbouring class.
"""

from __future__ import annotations

from slurm_robust.taxonomy import CATEGORIES, CLASS_CATEGORY, CLASSES, TABLE, canonical
from slurm_robust.vocabulary import HEALTH_STATUSES, RUN_STATUSES, RUNGS

TAXONOMY: dict[str, tuple[str, ...]] = {
    cat: tuple(row.cls.value for row in TABLE if row.category.value == cat)
    for cat in CATEGORIES}

# The recovery ladder (cheapest first), a run's end and a health check's verdict are the
# shared vocabulary's (slurm_robust/vocabulary.py), the words the records use.

__all__ = ["CATEGORIES", "CLASSES", "CLASS_CATEGORY", "HEALTH_STATUSES", "RUNGS",
           "RUN_STATUSES", "TAXONOMY", "read_class"]


def read_class(name: object, category: object = None) -> tuple[str | None, str]:
    """(the class a recorded name means, "") or (None, why the record is unread).

    ``category``, when given, must be the class's category in the table.
    """
    if not isinstance(name, str):
        return None, f"class {name!r} is not a string"
    cls = canonical(name)
    if cls is None:
        return None, f"unknown class {name!r}"
    if category is not None and category != CLASS_CATEGORY[cls.value]:
        return None, (f"class {name!r} is {CLASS_CATEGORY[cls.value]!r} in the taxonomy, "
                      f"the record says {category!r}")
    return cls.value, ""
