"""Byte ledger bookkeeping and the analytic formula for Qwen2.5-1.5B (pair A)."""

from __future__ import annotations

import math

import pytest

from commrl.compression import ByteLedger, analytic_tick_bytes, qwen25_15b_shapes
from commrl.compression.ledger import main, pair_a_summary, weight_update_elements


def test_ledger_ticks_anchor_share_and_ratio():
    ledger = ByteLedger()
    with ledger.anchor():
        ledger.add("activations_forward", 100, 100)
        ledger.add("weights", 50, 50)
    ledger.add("basis_refresh", 10, 0)
    first = ledger.end_tick()
    assert (first["comm/bytes_activations"], first["comm/bytes_weights"], first["comm/bytes_total"]) == (
        110,
        50,
        160,
    )
    assert first["comm/bytes_anchor"] == 150 and first["comm/bytes_basis_refresh"] == 10
    assert first["comm/ratio_vs_dense"] == pytest.approx(160 / 150)
    ledger.add("activations_backward", 5, 100)
    second = ledger.end_tick()
    assert second["comm/bytes_total"] == 5 and second["comm/bytes_anchor"] == 0
    assert second["comm/bytes_cumulative"] == 165 and second["comm/ratio_vs_dense"] == pytest.approx(
        165 / 250
    )
    restored = ByteLedger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.cumulative == 165 and restored.cumulative_dense == 250
    with pytest.raises(ValueError, match="unknown ledger channel"):
        ledger.add("gradients", 1, 1)


def test_qwen25_15b_shapes():
    shapes = qwen25_15b_shapes()
    n_params = sum(math.prod(s) for s in shapes["weight_shapes"])
    assert 1.54e9 < n_params < 1.55e9  # Qwen2.5-1.5B: 1.54 B parameters with tied embeddings
    assert (shapes["hidden"], shapes["layers"]) == (1536, 28)
    assert weight_update_elements((8960, 1536), 77, 2.0) == ((8960 + 1536) * 77, 8960 * 1536)
    assert weight_update_elements((1536,), 77, 2.0) == (1536, 1536)


def test_pair_a_by_hand():
    tokens = 512 * 8 * 1024
    b = pair_a_summary(tokens)
    act_fast = 2 * 28 * tokens * 77 * 2
    act_dense = 2 * 28 * tokens * 1536 * 2
    assert b.fast_activations == act_fast and b.dense_activations == act_dense
    assert b.fire_basis == 28 * 1536 * 77 * 2
    shapes = qwen25_15b_shapes()["weight_shapes"]
    sent = sum((s[0] + s[1]) * 77 if len(s) == 2 else s[0] for s in shapes)  # every matrix is compressible
    assert b.fast_weights == sent * 4
    # activations dominate: the cycle ratio approaches (1 + 19 r/d) / 20
    assert b.ratio_vs_dense == pytest.approx((1 + 19 * 77 / 1536) / 20, rel=0.01)
    no_anchor = analytic_tick_bytes(1536, 28, shapes, tokens, rank=77, anchor=False)
    assert no_anchor.ratio_vs_dense == pytest.approx(no_anchor.fast_tick / no_anchor.dense_tick)


def test_module_main_prints_pair_a(capsys):
    main()
    out = capsys.readouterr().out
    assert "1.544 B parameters" in out and f"{pair_a_summary().ratio_vs_dense:.4f}" in out
