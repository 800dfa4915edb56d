"""examples/ngram_baseline.py: the back-off n-gram predictor the drafters' per-slot accuracy is compared with."""

import importlib.util
from pathlib import Path

import numpy as np


def _module():
    path = Path(__file__).resolve().parents[1] / "examples" / "ngram_baseline.py"
    spec = importlib.util.spec_from_file_location("ngram_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _seq(ids, prompt=0):
    ids = np.asarray(ids, dtype=np.int64)
    mask = np.arange(len(ids)) >= prompt
    return ids, mask


def test_periodic_text_is_predicted_at_every_slot_and_prompt_positions_are_skipped():
    ngram = _module()
    train = [_seq([1, 2, 3] * 6)]
    held = [_seq([7, 7, 1, 2, 3, 1, 2, 3, 1], prompt=2)]  # two prompt tokens: no anchor, no label there
    result = ngram.slot_baseline(train, held, block_size=4, orders=(2, 1))
    assert result["slots"] == [1, 2, 3]
    assert result["accuracy"] == [1.0, 1.0, 1.0]
    # anchors p >= 2 (response) with p + k a response token inside the 9-token row: 9 - 2 - k of them
    assert result["positions"] == [6, 5, 4]


def test_the_longer_context_disambiguates_and_ties_go_to_the_smaller_id():
    ngram = _module()
    train = [_seq([1, 2, 3, 4, 2, 5, 1, 2, 3, 4, 2, 5])]  # after "2": 3 or 5 (a tie); after "4 2": always 5
    held = [_seq([4, 2, 5])]  # one slot-1 position: anchor "2" (p = 1), label 5
    assert ngram.slot_baseline(train, held, block_size=2, orders=(2, 1))["accuracy"] == [1.0]
    unigram = ngram.slot_baseline(train, held, block_size=2, orders=(1,))
    assert unigram["accuracy"] == [0.0]  # "2" -> 3 (the smaller id of the tie), not 5
    assert unigram["order_share"] == [{"1": 1.0, "0": 0.0}]
