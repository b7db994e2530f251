import math

import pytest
import torch

from commrl.rl.mismatch import mismatch_metrics, pearson


def test_identical_log_probs_agree_perfectly():
    lp = torch.log(torch.rand(4, 6) * 0.9 + 0.05)
    m = mismatch_metrics(lp, lp.clone(), torch.ones(4, 6))
    assert m["mismatch/logprob_corr"] == pytest.approx(1.0)
    assert m["mismatch/prob_gap"] == 0.0
    assert m["mismatch/async_clip_frac_eps0.2"] == 0.0


def test_clip_fractions_count_ratios_outside_their_bands():
    s = torch.zeros(1, 4)
    t = torch.log(torch.tensor([[1.0, 1.3, 0.1, 6.0]]))  # ratios 1, 1.3, 0.1, 6 against p_sampler = 1
    m = mismatch_metrics(s, t, torch.ones(1, 4))
    assert m["mismatch/async_clip_frac_eps0.2"] == 0.75
    assert m["mismatch/async_clip_frac_5x"] == 0.5
    assert math.isclose(m["mismatch/prob_gap"], (0 + 0.3 + 0.9 + 5.0) / 4, rel_tol=1e-6)


def test_mask_excludes_padding_and_pearson_matches_numpy():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    y = torch.tensor([2.0, 1.0, 4.0, 3.0], dtype=torch.float64)
    import numpy as np

    assert math.isclose(pearson(x, y), float(np.corrcoef(x, y)[0, 1]))
    s = torch.tensor([[0.0, -1.0, 5.0]])
    t = torch.tensor([[0.0, -1.0, -9.0]])
    assert mismatch_metrics(s, t, torch.tensor([[1.0, 1.0, 0.0]]))["mismatch/prob_gap"] == 0.0
