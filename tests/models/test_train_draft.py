"""``anycore train-draft`` on a tiny random target: the trained head is written in the EAGLE
layout, loads, and drafts what it learnt. A random target's continuations have no structure
to generalise, so the check is on the training sequences themselves: if training paired
features and tokens differently from drafting, or the written layout differed from the loaded
one, acceptance there would be near zero (an untrained head gets ~0). Output stays identical."""

from __future__ import annotations

from pathlib import Path

from anycore import LLM
from anycore.spec.train_draft import build_sequences, measure_acceptance, train
from tests.models.eagle_checkpoints import write_target

TEXT = Path(__file__).parents[1] / "data" / "prose.txt"


def test_a_trained_head_drafts_its_training_continuations(tmp_path, tokenizer):
    write_target(tmp_path / "target", tokenizer, 2)
    llm = LLM(model=str(tmp_path / "target"), dtype="float32", kv_cache_gb=0.01)
    ids = [t % 256 for t in tokenizer.encode(TEXT.read_text()[:4000])]
    seqs = build_sequences(llm, ids, 2, 12, 20, True, 0)
    lines: list[str] = []
    head = train(llm, seqs, 200, lr=1e-3, log=lines.append)
    head.save(tmp_path / "head")
    assert float(lines[-1].split("top-1 ")[1].split()[0]) > 0.5  # (the last step's training accuracy)
    m = measure_acceptance(str(tmp_path / "target"), tmp_path / "head", [s[:12] for s in seqs], 20,
                           dtype="float32", kv_cache_gb=0.01)
    assert m["identical"] == 1.0
    assert m["acceptance_rate"] > 0.3, m  # (an untrained head: ~0.01)
    # as tree drafts (top-2): accepted paths' features feed the head, the others' slots go back
    tree = measure_acceptance(str(tmp_path / "target"), tmp_path / "head", [s[:12] for s in seqs], 20, topk=2,
                              dtype="float32", kv_cache_gb=0.01)
    assert tree["identical"] == 1.0
    assert tree["acceptance_rate"] > 0.3, tree
