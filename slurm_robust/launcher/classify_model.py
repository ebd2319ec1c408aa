"""The classifier's learned fallback: a small text model over the words of a log tail.

Where the rules find no deciding line at all (classify's ``exit_status`` catch-all: no
log rule, no exception, no Xid, no kernel or NVML record), this model names the likeliest
class from the log's words. It is a softmax (multinomial logistic) regression over word
presence, trained on the failure corpus's development split only
(slurm_robust_rehearsal.bench.classify_train rebuilds ``classify_model.json``
deterministically; the split rule is corpus_split.py's). Inference is a dictionary lookup
and a sum per class in pure Python: no ML library in the controller.

The model only names a class. classify.py decides what that may do: never a class that
blames a node by itself (policy's evicting classes are not offered), never an
infrastructure side, the weakest strength; the evidence records ``rule: "learned"``, the
probability and the words that decided.

A model file that is missing or malformed is refused with a clear error by
:func:`load_model`; :func:`default_model` logs that once and returns None, and the
classifier then answers from its rules alone (bad input never stops the controller).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

log = logging.getLogger("slurm_robust.launcher.classify_model")

#: The model file's format version; a file of another version is refused.
MODEL_VERSION = 1
#: The tokenizer's version: a model records the one it was trained with.
TOKENIZER_VERSION = 1
MODEL_PATH = Path(__file__).with_name("classify_model.json")

# Runs of letters and digits (an underscore, a dot or a slash separates words, so
# CUDA_ERROR_X is three words); a camelCase run's parts become separate words, and the
# whole run one more word (cudaErrorX: "cuda", "error", "x"... and "cudaerrorx").
_CHUNK = re.compile(r"[A-Za-z0-9]+")
_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
# Numbers, hex addresses and ids say nothing about the class and never repeat between
# logs (pids, ranks, timestamps, pointers).
_NUMERIC = re.compile(r"^(0x)?[0-9a-fA-F]*\d[0-9a-fA-F]*$")
# Function words: frequent everywhere, evidence of nothing.
_STOP = frozenset("the a an of to in on at is it for and or be by as with from this that "
                  "was are not".split())


def words(text: str) -> list[str]:
    """The normalised words of ``text``: lowercase identifier parts (and each camelCase
    identifier whole), without numbers, hex, one-letter parts and function words."""
    out: list[str] = []
    for chunk in _CHUNK.findall(text):
        if _NUMERIC.match(chunk):
            continue
        parts = [p.lower() for p in _PART.findall(chunk)]
        parts = [p for p in parts if len(p) >= 2 and not p.isdigit() and p not in _STOP]
        out.extend(parts)
        if len(parts) > 1:
            out.append("".join(parts))
    return out


def exit_token(exit_code: int | None, sig: int | None) -> str:
    """The exit status as one pseudo-word ("#sig9", "#exit1", "#noexit")."""
    if sig is not None:
        return f"#sig{sig}"
    return f"#exit{exit_code}" if exit_code is not None else "#noexit"


def features(text: str, exit_code: int | None, sig: int | None) -> set[str]:
    """What the model reads of one failure: which words occur (not how often: a log that
    repeats a line thirty times says it once), and the exit status."""
    return {*words(text), exit_token(exit_code, sig)}


class ModelError(ValueError):
    """A model file that cannot be used (missing, unreadable, wrong version or shape)."""


@dataclass(frozen=True)
class Prediction:
    cls: str
    probability: float
    # The words that raised this class's score most, strongest first.
    top_words: tuple[str, ...]
    # Words of the log the model knows (the pseudo-word of the exit status excluded).
    known_words: int


@dataclass(frozen=True)
class Model:
    classes: tuple[str, ...]
    bias: tuple[float, ...]
    # word -> its weight for each class, in ``classes`` order.
    weights: Mapping[str, Sequence[float]]
    meta: Mapping[str, Any]

    def scores(self, feats: Iterable[str]) -> tuple[list[float], list[str]]:
        """Per-class scores of a feature set, and the features the model knows. A sum
        divided by sqrt(number of known features), as in training (a long log is not
        more certain than a short one)."""
        known = sorted(f for f in set(feats) if f in self.weights)
        totals = [0.0] * len(self.classes)
        for f in known:
            for c, w in enumerate(self.weights[f]):
                totals[c] += w
        norm = math.sqrt(len(known)) if known else 1.0
        return [b + t / norm for b, t in zip(self.bias, totals, strict=True)], known

    def predict(self, feats: Iterable[str], allowed: Sequence[str] | None = None
                ) -> Prediction | None:
        """The likeliest class among ``allowed`` (None: any), its probability over all
        classes, and the words behind it; None when no class is allowed."""
        scores, known = self.scores(feats)
        top = max(scores)
        exp = [math.exp(s - top) for s in scores]
        total = sum(exp)
        ranked = sorted(range(len(self.classes)), key=lambda i: (-scores[i], self.classes[i]))
        choice = next((i for i in ranked if allowed is None or self.classes[i] in allowed),
                      None)
        if choice is None:
            return None
        pull = sorted(((self.weights[f][choice], f) for f in known),
                      key=lambda wf: (-wf[0], wf[1]))
        return Prediction(self.classes[choice], exp[choice] / total,
                          tuple(f for w, f in pull[:5] if w > 0),
                          sum(1 for f in known if not f.startswith("#")))


def model_from_json(doc: Mapping[str, Any]) -> Model:
    """A Model from the file's JSON object; ModelError if it is not a usable model."""
    try:
        if doc.get("model_version") != MODEL_VERSION:
            raise ModelError(f"model_version {doc.get('model_version')!r}, this classifier "
                             f"reads {MODEL_VERSION}")
        if doc.get("tokenizer_version") != TOKENIZER_VERSION:
            raise ModelError(f"tokenizer_version {doc.get('tokenizer_version')!r}, this "
                             f"classifier tokenizes as {TOKENIZER_VERSION}")
        classes = tuple(str(c) for c in doc["classes"])
        bias = tuple(float(b) for b in doc["bias"])
        if not classes or len(bias) != len(classes):
            raise ModelError(f"{len(classes)} classes but {len(bias)} biases")
        weights: dict[str, tuple[float, ...]] = {}
        for word, row in doc["weights"].items():
            weights[str(word)] = tuple(float(w) for w in row)
            if len(weights[str(word)]) != len(classes):
                raise ModelError(f"word {word!r}: {len(row)} weights for "
                                 f"{len(classes)} classes")
        meta = {k: v for k, v in doc.items() if k not in ("weights", "bias", "classes")}
        return Model(classes, bias, weights, meta)
    except ModelError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelError(f"malformed model: {type(exc).__name__}: {exc}") from exc


def load_model(path: Path = MODEL_PATH) -> Model:
    """The model in ``path``; ModelError (naming the file) if it is missing or bad."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the classifier model {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: not a JSON object")
    try:
        return model_from_json(doc)
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from exc


@lru_cache(maxsize=1)
def default_model() -> Model | None:
    """The shipped model, read once; None (after one warning) when it cannot be used:
    the classifier then answers from its rules alone."""
    try:
        return load_model(MODEL_PATH)
    except ModelError as exc:
        log.warning("learned classifier fallback disabled, rules only: %s", exc)
        return None
