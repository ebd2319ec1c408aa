"""The classifier's learned fallback (launcher/classify_model.py): the shipped model is
what the development split trains today, it fixes catch-all answers it was not trained
on, it never blames a node, and a bad model file leaves the rules alone."""

from __future__ import annotations

import json
import logging

import pytest

from slurm_robust.launcher import classify_model as cm
from slurm_robust.launcher.classify import (
    LEARNABLE,
    LEARNED_FROM,
    Evidence,
    classify,
    model_features,
)
from slurm_robust.launcher.control.policy import EVICTING_CLASSES, blamed_nodes
from slurm_robust.taxonomy import ROWS, Action, FailureClass, Side, node_side
from slurm_robust_rehearsal.bench import classify as bench
from slurm_robust_rehearsal.bench import classify_train as train
from slurm_robust_rehearsal.bench.corpus_split import Split, split_of

ENTRIES, _ = bench.load_corpus(bench.CORPUS)
DEV = train.development(ENTRIES)
SHIPPED = json.loads(cm.MODEL_PATH.read_text())
# Development entries whose exit the rules explain by nothing (the catch-all) and that a
# model trained without them still classifies right. (An example stops being one when
# the corpus or the rules move: mplbm-92's SIGKILL under MPI read as host memory until the
# ninth batch brought more bare SIGKILLs labelled worker_signal, and a rule now reads
# langchain-chatchat-35's "Killed" after loading shards; fragpipe-703, a cgroup OOM kill,
# and notsofar-29, azcopy's reset against Azure storage, replaced them.)
UNSEEN_BY_MODEL = ("notsofar-29-azcopy-reset", "mesh-jax-154-gcs-save-failed-3-times",
                   "fragpipe-703-cgroup-oom-ram-param")


def _evidence(entry) -> Evidence:
    return Evidence(exit_code=entry.exit_code, signal=entry.signal, log_tail=entry.excerpt,
                    change_recorded=entry.change_recorded)


@pytest.fixture(scope="module")
def retrained() -> dict:
    return train.train(ENTRIES)


def test_the_shipped_model_is_what_the_development_split_trains(retrained):
    assert SHIPPED["model_version"] == cm.MODEL_VERSION
    assert SHIPPED["trained_on"] == retrained["trained_on"]
    assert SHIPPED["trained_on"]["split"] == "development"
    assert SHIPPED["trained_on"]["entries"] == len(DEV)
    assert SHIPPED["trained_on"]["ids_sha256"] == train.ids_hash(DEV)
    assert SHIPPED["classes"] == retrained["classes"]
    assert SHIPPED["weights"].keys() == retrained["weights"].keys()
    # Stored to 3 decimals: another numpy or BLAS may round a last digit the other way.
    assert SHIPPED["bias"] == pytest.approx(retrained["bias"], abs=2e-3)
    for word, row in retrained["weights"].items():
        assert SHIPPED["weights"][word] == pytest.approx(row, abs=2e-3), word


def test_training_never_reads_a_held_out_entry(retrained):
    dev_only = [e for e in ENTRIES if split_of(e.url) is Split.DEVELOPMENT]
    assert len(dev_only) < len(ENTRIES)
    assert train.train(dev_only) == retrained
    # A held-out entry's words appear nowhere in the model unless a development entry
    # has them too: dropping all of them from the corpus changes nothing above.


def test_training_reads_the_text_inference_reads():
    # The model is trained on what classify shows it: the log tail without launcher
    # prefixes ("[rank3]:", "[stderr]") and the exit status as the classifier reads it
    # (a shell's 128+N is the signal N).
    for entry in DEV:
        assert train.entry_features(entry) == model_features(_evidence(entry)), entry.id
    ev = Evidence(exit_code=137, log_tail="[rank3]: RuntimeError: shard download failed")
    assert model_features(ev) == {"runtime", "error", "runtimeerror", "shard", "download",
                                  "failed", "#sig9"}


def test_the_fallback_fixes_catch_alls_it_was_not_trained_on():
    by_id = {e.id: e for e in DEV}
    model = cm.model_from_json(train.train([e for e in DEV if e.id not in UNSEEN_BY_MODEL]))
    for entry_id in UNSEEN_BY_MODEL:
        entry = by_id[entry_id]
        rules = classify(_evidence(entry), learned=False)
        assert rules.rule == LEARNED_FROM and rules.cls != entry.cls, entry_id
        c = classify(_evidence(entry), model=model)
        assert (c.cls, c.rule, c.side, c.strength) == (entry.cls, "learned", "unknown",
                                                       "generic"), entry_id
        why = c.evidence["classifier"]
        assert why["rules_said"] == rules.cls and 0.2 <= why["probability"] <= 1
        assert why["words"] and why["model_version"] == cm.MODEL_VERSION
        assert c.signature is not None and c.signature.startswith(f"{entry.cls}:learned:")


def test_no_learnable_class_blames_a_node():
    assert not LEARNABLE & EVICTING_CLASSES
    assert "nan" not in LEARNABLE and "code_data_change" not in LEARNABLE
    for name in LEARNABLE:
        assert ROWS[FailureClass(name)].action is not Action.EVICT
        assert not node_side(name, Side.UNKNOWN.value)
        assert blamed_nodes(name, ["n1"], {"n1": 1}, 3, Side.UNKNOWN.value) == ()


@pytest.mark.parametrize("cls", sorted(EVICTING_CLASSES))
def test_a_log_in_the_words_of_an_evicting_class_is_never_learned_as_one(cls):
    # The words that pull hardest towards the class in the shipped model, with no line
    # any rule reads: the model may lean to the class, the answer never names it.
    model = cm.load_model()
    col = model.classes.index(cls) if cls in model.classes else None
    if col is None:
        pytest.skip(f"{cls} has no corpus entry to learn from")
    top = sorted(model.weights, key=lambda w: -model.weights[w][col])
    tail = " ".join(w for w in top if not w.startswith("#"))[:400]
    for code, sig in ((None, None), (1, None), (None, 9)):
        c = classify(Evidence(exit_code=code, signal=sig, log_tail=tail))
        assert c.cls != cls or c.rule != "learned", (cls, tail)
        if c.rule == "learned":
            assert c.side == Side.UNKNOWN.value and c.action != Action.EVICT.value
            assert c.cls in LEARNABLE


def test_no_learned_answer_on_the_development_entries_evicts_or_takes_a_side():
    for entry in DEV:
        c = classify(_evidence(entry))
        if c.rule == "learned":
            assert c.side == Side.UNKNOWN.value and not c.evicts, entry.id
            assert c.cls in LEARNABLE and c.strength == "generic"


def test_only_the_catch_all_is_replaced():
    # A rule's answer, however weak, stands (a bare "Killed" line, a broken connection).
    for tail in ("Killed", "Connection reset by peer", TAIL_EXC):
        rules = classify(Evidence(exit_code=1, log_tail=tail), learned=False)
        assert classify(Evidence(exit_code=1, log_tail=tail)) == rules, tail


TAIL_EXC = 'Traceback (most recent call last):\n  File "t.py", line 3, in f\nKeyError: 3'


# The last lines of a rank log of examples/train_gpt.py on the mini-cluster (a restarted
# generation: torch's c10d warning, then the script's own start-up line).
ORDINARY_TAIL = ("[W1204 22:12:48.468777610 socket.cpp:207] [c10d] The hostname of the client "
                 "socket cannot be retrieved. err=-3\n"
                 "rank 1: fresh start: no checkpoint copies found\n")


@pytest.mark.parametrize(("code", "sig"), [(None, 9), (None, 15), (1, None)])
def test_a_tail_of_ordinary_output_is_not_read_by_the_model(code, sig):
    # A killed worker (or one that exited without a word) of a healthy script: its tail
    # names no failure, and the model, which has seen error excerpts only, would read its
    # noise as a class (bad_config at p 0.4 before this gate). The catch-all stands.
    c = classify(Evidence(exit_code=code, signal=sig, log_tail=ORDINARY_TAIL))
    assert (c.cls, c.rule) == ("worker_signal", LEARNED_FROM)


def test_a_failure_in_the_last_lines_is_read_by_the_model():
    tail = ORDINARY_TAIL + ("error: training aborted at step 8: sequence length must be "
                            "positive, got -1 in batch of step 8\n")
    c = classify(Evidence(exit_code=1, signal=None, log_tail=tail))
    assert (c.rule, c.side, c.strength) == ("learned", "unknown", "generic")
    assert c.evidence["classifier"]["rules_said"] == "worker_signal"


def test_too_few_known_words_or_a_weak_guess_leave_the_rules_answer():
    rules = classify(Evidence(signal=9, log_tail="Loading shards"), learned=False)
    assert classify(Evidence(signal=9, log_tail="Loading shards")) == rules
    # Healthy progress lines read as NaN to the model, which may not say NaN: the rules'
    # catch-all stands.
    progress = "\n".join(f"step {i} loss {2.0 - i / 100} lr 0.0003 grad_norm 1.1"
                         for i in range(20))
    for code, sig in ((None, 9), (1, None), (None, 11)):
        c = classify(Evidence(exit_code=code, signal=sig, log_tail=progress))
        assert (c.cls, c.rule) == ("worker_signal", LEARNED_FROM)


def test_a_bad_model_file_is_refused_clearly(tmp_path):
    with pytest.raises(cm.ModelError, match="cannot read the classifier model"):
        cm.load_model(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    for text, why in (("{", "cannot read"), ("[]", "not a JSON object"),
                      (json.dumps({**SHIPPED, "model_version": 99}), "model_version 99"),
                      (json.dumps({**SHIPPED, "bias": [0.0]}), "biases"),
                      (json.dumps({**SHIPPED, "weights": {"x": [1.0]}}), "weights for"),
                      (json.dumps({k: v for k, v in SHIPPED.items() if k != "classes"}),
                       "malformed")):
        bad.write_text(text)
        with pytest.raises(cm.ModelError, match=why) as err:
            cm.load_model(bad)
        assert str(bad) in str(err.value)


def test_without_a_usable_model_the_rules_answer_alone(tmp_path, monkeypatch, caplog):
    entry = next(e for e in DEV if e.id == UNSEEN_BY_MODEL[0])
    rules = classify(_evidence(entry), learned=False)
    monkeypatch.setattr(cm, "MODEL_PATH", tmp_path / "gone.json")
    cm.default_model.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="slurm_robust.launcher.classify_model"):
            assert classify(_evidence(entry)) == rules
            assert classify(_evidence(entry)) == rules
        warnings = [r for r in caplog.records if "rules only" in r.getMessage()]
        assert len(warnings) == 1 and "gone.json" in warnings[0].getMessage()
    finally:
        cm.default_model.cache_clear()


def test_words_are_normalised():
    assert cm.words("CUDA_ERROR_ILLEGAL_ADDRESS at 0x7f3a2c") == [
        "cuda", "error", "illegal", "address"]
    assert cm.words("cudaErrorMemoryAllocation in /dev/shm/torch_1234") == [
        "cuda", "error", "memory", "allocation", "cudaerrormemoryallocation", "dev", "shm",
        "torch"]
    assert cm.words("the rank 12 of 64 is 3.5 s late") == ["rank", "late"]
    assert cm.exit_token(None, 9) == "#sig9" and cm.exit_token(1, None) == "#exit1"
    assert cm.exit_token(None, None) == "#noexit"
