"""The controller's replies, encoded without redoing the per-rank work each time.

A reply carries the agent's whole plan (protocol.py), and an active plan names the node
of every rank of the world (``rank_nodes``; on the wire compact runs, "rank_map",
launcher/rank_map.py): 8,192 ranks at 1,024 nodes of 8. Making the runs walks every
rank (a few ms at that size), so the list, the same object in every plan of a
generation (plans.generation_plans), is encoded once and its JSON spliced into each
reply; the rest of the plan is small.

The bytes are exactly what ``Channel.send(Reply(...).to_json())`` writes (the same
separators, key order and escaping).

Most reports find their agent's plan as it was: a reply that repeated it cost 65-90 KB
of socket writes per report at 1,024 nodes (and as much JSON decoding on the agent).
Every plan handed out therefore carries an identity, ``plan_id``: the controller's
incarnation (its term and a random nonce drawn when it starts) and a digest of the
plan's bytes. A report names the identity of the plan its agent holds; when that is the
identity of the plan the controller would send now, the reply is the short "unchanged"
form (messages.Reply). The digest covers the whole plan (term, poll_s, drain_s, ...), so
any change, however small, sends the plan again; the incarnation makes an identity that
another controller issued (a predecessor before failover, a controller of an earlier
run) never match, so an agent never keeps a plan that this controller did not hand it.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from slurm_robust.launcher import rank_map
from slurm_robust.launcher.messages import Plan

#: Hex digits of a plan digest kept in its identity (80 bits: a collision between two
#: plans of one controller is not a concern).
_DIGEST_HEX = 20

_SEPARATORS = (",", ":")
#: The wire key of Plan.rank_nodes.
_RANK_MAP_KEY = "rank_map"
#: The rank map's wire value while the plan's JSON is made without it, and that JSON's
#: text for it (where the list's own JSON goes).
_LEAN_NODES = {"rank_nodes": []}
_LEAN_MAP = f'"{_RANK_MAP_KEY}":[]'
#: Distinct rank_nodes lists kept encoded (a generation has one; a dual-phase replay
#: one per group).
_KEEP = 16


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=_SEPARATORS, default=str)


def incarnation(term: int) -> str:
    """A controller's incarnation: its term and a nonce no other controller shares (two
    controllers of one term cannot both act, but a test or a bench may build several)."""
    return f"{term}.{secrets.token_hex(4)}"


class ReplyEncoder:
    """Encodes replies; safe to call from any thread. ``incarnation`` prefixes
    every plan identity it makes (see the module docstring)."""

    def __init__(self, incarnation: str) -> None:
        self.incarnation = incarnation
        self._lock = threading.Lock()
        #: id(list) -> (a copy of the list, its JSON, the JSON's digest)
        self._lists: OrderedDict[int, tuple[list[str], str, str]] = OrderedDict()

    def encode(self, plan: Plan | None, held: str | None = None) -> bytes:
        """The reply to a report whose agent holds plan ``held`` (None: none, or one it
        does not name): "unchanged" when ``held`` is ``plan``'s identity, else ``plan``
        in full with its identity."""
        return self.encode_identified(plan, held)[0]

    def encode_identified(self, plan: Plan | None, held: str | None = None,
                          push: bool = False) -> tuple[bytes, str | None]:
        """``encode``'s bytes and the plan's identity (None for no plan); ``push``: the
        full form marked as sent unasked (messages.Reply), never "unchanged"."""
        if plan is None:
            return b'{"plan":{}}\n', None
        return self._encode(plan, self._listed(plan), held, push)

    def encode_pushes(self, plans: Sequence[Plan | None]) -> list[tuple[bytes, str | None]]:
        """``encode_identified(plan, push=True)`` for each plan, in order. The plans of
        one decision share their rank_nodes list (plans.generation_plans): its JSON is
        looked up once per distinct list here, not once per plan (checking a cached
        list against 32,768 names cost more than the rest of a push's encoding)."""
        listed: dict[int, tuple[list[str], tuple[str, str]]] = {}
        out: list[tuple[bytes, str | None]] = []
        for plan in plans:
            if plan is None:
                out.append((b'{"plan":{}}\n', None))
                continue
            nodes = plan.rank_nodes
            hit = None
            if nodes:
                # Keyed by the list object, kept alive by the entry (its id stays its).
                known = listed.get(id(nodes))
                if known is None:
                    known = listed[id(nodes)] = (nodes, self._list_json(nodes))
                hit = known[1]
            out.append(self._encode(plan, hit, None, True))
        return out

    def plan_id(self, plan: Plan) -> str:
        """The identity ``encode`` gives ``plan``."""
        return self._lean(plan, self._listed(plan))[1]

    def _listed(self, plan: Plan) -> tuple[str, str] | None:
        """The JSON and digest of ``plan``'s rank_nodes list (None: it has none)."""
        return self._list_json(plan.rank_nodes) if plan.rank_nodes else None

    def _lean(self, plan: Plan, listed: tuple[str, str] | None) -> tuple[str, str]:
        """The plan's JSON with an empty rank map standing in for its list (a few
        hundred bytes to hash), and the plan's identity."""
        small = _dumps(plan.to_json_with(_LEAN_NODES if listed else None))
        return small, self._identity(small, listed[1] if listed else "")

    def _encode(self, plan: Plan, listed: tuple[str, str] | None, held: str | None,
                push: bool) -> tuple[bytes, str | None]:
        # The list's own JSON is spliced in where the empty map stands. An unescaped
        # '"rank_map":[]' occurs nowhere else in it: a quote inside a JSON string value
        # is always escaped.
        small, plan_id = self._lean(plan, listed)
        if held == plan_id and not push:
            return ('{"unchanged":true,"plan_id":' + _dumps(plan_id) + "}\n").encode(), \
                plan_id
        if listed is not None:
            small = small.replace(_LEAN_MAP, f'"{_RANK_MAP_KEY}":{listed[0]}', 1)
        tail = ',"push":true}\n' if push else "}\n"
        return ('{"plan":' + small + ',"plan_id":' + _dumps(plan_id) + tail).encode(), \
            plan_id

    def _identity(self, small_json: str, nodes_digest: str) -> str:
        # The rank_nodes list enters through its own digest (cached with its JSON): the
        # plan without it is a few hundred bytes to hash per report.
        digest = hashlib.blake2b(f"{small_json}\0{nodes_digest}".encode(),
                                 digest_size=_DIGEST_HEX // 2).hexdigest()
        return f"{self.incarnation}:{digest}"

    def _list_json(self, nodes: list[str]) -> tuple[str, str]:
        key = id(nodes)
        with self._lock:
            hit = self._lists.get(key)
        # The copy guards against a list changed in place or a reused id; comparing
        # a list with its copy is one identity check per item.
        if hit is not None and hit[0] == nodes:
            return hit[1], hit[2]
        copy = list(nodes)
        text = _dumps(rank_map.encode(copy))
        digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
        with self._lock:
            self._lists[key] = (copy, text, digest)
            self._lists.move_to_end(key)
            while len(self._lists) > _KEEP:
                self._lists.popitem(last=False)
        return text, digest
