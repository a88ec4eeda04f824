"""The Tune settings the driver sets for a sweep: the experiment-state save period grows with
the number of trials (a save is O(T): a fixed period would make the driver's CPU O(T²)), and a
value the user set is kept."""

from __future__ import annotations

import os

from sweeps.run.driver import state_save_period, tune_settings


def test_the_state_save_period_scales_with_the_sweep(monkeypatch):
    monkeypatch.delenv("TUNE_GLOBAL_CHECKPOINT_S", raising=False)
    monkeypatch.delenv("TUNE_MAX_PENDING_TRIALS_PG", raising=False)
    assert state_save_period(4) == 10.0  # Tune's own floor
    assert state_save_period(512) == 2 * state_save_period(256) > 10
    with tune_settings(conc=3, trials=512):
        assert float(os.environ["TUNE_GLOBAL_CHECKPOINT_S"]) == state_save_period(512)
        assert os.environ["TUNE_MAX_PENDING_TRIALS_PG"] == "3"
    assert "TUNE_GLOBAL_CHECKPOINT_S" not in os.environ
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "auto")
    with tune_settings(conc=3, trials=512):
        assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "auto"
    assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "auto"
