"""The controller's replies, encoded without redoing the per-rank work each time.

A reply carries the agent's whole plan (protocol.py), and an active plan names the node
of every rank of the world (``rank_nodes``): 8,192 names at 1,024 nodes of 8 ranks. Built
through ``Plan.to_json`` and ``json.dumps`` for every report, that list cost about 3 ms
of controller CPU per reply at that size, more than everything else a report costs. The
list is the same object in every plan of a generation (plans.generation_plans), so its
JSON is encoded once and spliced into each reply; the rest of the plan is small.

The bytes are exactly what ``Channel.send({"plan": plan.to_json()})`` writes (the same
separators, key order and escaping): the wire does not change.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from typing import Any

from slurm_robust.launcher.messages import Plan

_SEPARATORS = (",", ":")
#: Distinct rank_nodes lists kept encoded (a generation has one; a dual-phase replay
#: one per group).
_KEEP = 16


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=_SEPARATORS, default=str)


class ReplyEncoder:
    """Encodes ``{"plan": ...}`` replies; safe to call from the handler threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: id(list) -> (a copy of the list, its JSON)
        self._lists: OrderedDict[int, tuple[list[str], str]] = OrderedDict()

    def encode(self, plan: Plan | None) -> bytes:
        if plan is None:
            return b'{"plan":{}}\n'
        nodes = plan.rank_nodes
        if not nodes:
            return (_dumps({"plan": plan.to_json()}) + "\n").encode()
        small = dataclasses.replace(plan, rank_nodes=[]).to_json()
        fragment = self._list_json(nodes)
        parts = [f"{_dumps(k)}:{fragment if k == 'rank_nodes' else _dumps(v)}"
                 for k, v in small.items()]
        return ('{"plan":{' + ",".join(parts) + "}}\n").encode()

    def _list_json(self, nodes: list[str]) -> str:
        key = id(nodes)
        with self._lock:
            hit = self._lists.get(key)
        # The copy guards against a list changed in place or a reused id; comparing
        # a list with its copy is one identity check per item.
        if hit is not None and hit[0] == nodes:
            return hit[1]
        copy = list(nodes)
        text = _dumps(copy)
        with self._lock:
            self._lists[key] = (copy, text)
            self._lists.move_to_end(key)
            while len(self._lists) > _KEEP:
                self._lists.popitem(last=False)
        return text
