"""Committed PREDICTED result files are what the current code prints (scripts/bench/predicted.py)."""

import pytest

from scripts.bench import predicted


@pytest.mark.parametrize("stem", sorted(predicted.PREDICTED))
def test_committed_prediction_is_current(stem, tmp_path):
    stale = predicted.differences(stem, predicted.write(stem, tmp_path))
    assert not stale, f"{stale}: regenerate with `python -m scripts.bench.predicted`"


def test_a_changed_prediction_is_caught(tmp_path):
    stem = "planner_7b_8xh200_predicted"
    fresh = predicted.write(stem, tmp_path)
    fresh.write_text(fresh.read_text().replace('"step_s": 0.', '"step_s": 1.', 1))
    assert predicted.differences(stem, fresh)
