"""Compression points on a tiny Qwen2: modes, masks, tuple outputs, byte counting, unsupported models."""

from __future__ import annotations

import pytest
import torch
from compression_helpers import HIDDEN, batch_for_tick, tiny_qwen2
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from commrl.compression import (
    ByteLedger,
    CompressionPoints,
    IdentityCodec,
    LowRankActivationCodec,
    PRFMaskActivationCodec,
)

RANK = 8


def capture_layer_outputs(model: nn.Module) -> tuple[list[torch.Tensor], list]:
    """Hooks registered after the compression points see what the next layer receives."""
    seen: list[torch.Tensor] = []
    handles = [
        layer.register_forward_hook(lambda m, a, out: seen.append(out[0] if isinstance(out, tuple) else out))
        for layer in model.model.layers
    ]
    return seen, handles


def test_compressed_outputs_lie_in_the_basis_and_dense_is_untouched():
    model = tiny_qwen2()
    ids, mask = batch_for_tick(0)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask.long()).logits
    codec = LowRankActivationCodec(HIDDEN, RANK, 2, seed=0)
    points = CompressionPoints(model, codec, ByteLedger())
    seen, _ = capture_layer_outputs(model)
    with torch.no_grad():
        outside = model(input_ids=ids, attention_mask=mask.long()).logits
        with points.session("dense", tick=0, token_mask=mask):
            dense = model(input_ids=ids, attention_mask=mask.long()).logits
        seen.clear()
        with points.session("compressed", tick=0, token_mask=mask):
            compressed = model(input_ids=ids, attention_mask=mask.long()).logits
    assert torch.equal(outside, plain) and torch.equal(dense, plain)
    assert (compressed - plain).abs().max() > 1e-3
    for point, A_hat in enumerate(seen):
        Q = codec.bases[point]
        torch.testing.assert_close(A_hat @ Q @ Q.T, A_hat, atol=1e-5, rtol=1e-5)
    assert points.tokens_compressed == int(mask.sum())
    points.remove()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask.long()).logits, plain)


def test_bytes_forward_backward_and_padding():
    model = tiny_qwen2()
    ids, mask = batch_for_tick(0)
    tokens = int(mask.sum())
    ledger = ByteLedger()
    points = CompressionPoints(model, LowRankActivationCodec(HIDDEN, RANK, 2, seed=0), ledger)
    with torch.no_grad(), points.session("compressed", tick=0, token_mask=mask):
        model(input_ids=ids, attention_mask=mask.long())
    assert ledger.tick_bytes["activations_forward"] == 2 * tokens * RANK * 4
    assert ledger.tick_bytes["activations_backward"] == 0  # no grad, nothing flows back
    with points.session("compressed", tick=0, token_mask=mask):
        model(input_ids=ids, attention_mask=mask.long()).logits.sum().backward()
    assert ledger.tick_bytes["activations_forward"] == 2 * 2 * tokens * RANK * 4
    assert ledger.tick_bytes["activations_backward"] == 2 * tokens * RANK * 4
    assert ledger.tick_dense == 3 * 2 * tokens * HIDDEN * 4
    with points.session("compressed", tick=0):  # no mask at all: every position counts
        model(input_ids=ids)
    assert ledger.tick_bytes["activations_forward"] == 2 * (2 * tokens + ids.numel()) * RANK * 4
    with torch.no_grad(), points.session("compressed", tick=0):  # the forward's attention mask is read
        model(input_ids=ids, attention_mask=mask.long())
    assert ledger.tick_bytes["activations_forward"] == 2 * (3 * tokens + ids.numel()) * RANK * 4


def test_sketch_mode_accumulates_over_real_tokens_only():
    model = tiny_qwen2()
    ids, mask = batch_for_tick(1)
    codec = LowRankActivationCodec(HIDDEN, RANK, 2, seed=0)
    points = CompressionPoints(model, codec, ByteLedger())
    seen, _ = capture_layer_outputs(model)
    codec.begin_sketch()
    with torch.no_grad(), points.session("sketch", tick=0, token_mask=mask):
        model(input_ids=ids, attention_mask=mask.long())
    for point, A in enumerate(seen):
        rows = A[mask]
        Q = codec.bases[point]
        torch.testing.assert_close(codec.sketches[point], rows.T @ (rows @ Q), atol=1e-4, rtol=1e-5)


def test_uncounted_sessions_and_chosen_layers():
    """count=False applies the codec but adds no byte; ``layers`` puts points on the named layers only."""
    model = tiny_qwen2()
    ids, mask = batch_for_tick(0)
    ledger = ByteLedger()
    codec = LowRankActivationCodec(HIDDEN, RANK, 1, seed=0)
    points = CompressionPoints(model, codec, ledger, layers=[0])
    seen, _ = capture_layer_outputs(model)
    with points.session("compressed", tick=0, token_mask=mask, count=False):
        model(input_ids=ids, attention_mask=mask.long()).logits.sum().backward()
    assert ledger.tick_dense == 0 and sum(ledger.tick_bytes.values()) == 0 and points.tokens_compressed == 0
    Q = codec.bases[0]
    torch.testing.assert_close(seen[0] @ Q @ Q.T, seen[0], atol=1e-5, rtol=1e-5)
    assert (seen[1] @ Q @ Q.T - seen[1]).abs().max() > 1e-2  # layer 1 has no point
    with torch.no_grad(), points.session("compressed", tick=0, token_mask=mask):
        model(input_ids=ids, attention_mask=mask.long())
    assert ledger.tick_bytes["activations_forward"] == int(mask.sum()) * RANK * 4  # one point counted
    with pytest.raises(ValueError, match="do not fit a model with 2 decoder layers"):
        CompressionPoints(model, codec, ledger, layers=[2])


def test_prf_mask_follows_the_microbatch_id():
    model = tiny_qwen2()
    ids, mask = batch_for_tick(2)
    points = CompressionPoints(model, PRFMaskActivationCodec(keep=0.5, seed=0), ByteLedger())

    def logits(tick: int, microbatch: int) -> torch.Tensor:
        with torch.no_grad(), points.session("compressed", tick=tick, microbatch=microbatch, token_mask=mask):
            return model(input_ids=ids, attention_mask=mask.long()).logits

    assert torch.equal(logits(3, 1), logits(3, 1))  # old/ref log-prob passes see the training pass's mask
    assert not torch.equal(logits(3, 1), logits(3, 2))
    assert not torch.equal(logits(3, 1), logits(4, 1))


class TupleLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, str]:
        return self.linear(x), "cache"


class TupleModel(nn.Module):
    """Llama layout with decoder layers that return tuples (older transformers releases do)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = type("Config", (), {"model_type": "llama", "hidden_size": 8})()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([TupleLayer(), TupleLayer()])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
        tails = []
        for layer in self.model.layers:
            x, tail = layer(x)
            tails.append(tail)
        return x, tails


def test_tuple_outputs_keep_their_tail():
    model = TupleModel()
    codec = LowRankActivationCodec(8, 2, 2, seed=0)
    points = CompressionPoints(model, codec, ByteLedger())
    x = torch.randn(3, 8)
    with points.session("compressed", tick=0):
        out, tails = model(x)
    assert tails == ["cache", "cache"]
    Q = codec.bases[1]
    torch.testing.assert_close(out @ Q @ Q.T, out, atol=1e-6, rtol=1e-6)


def test_identity_codec_counts_dense_bytes():
    model = tiny_qwen2()
    ids, mask = batch_for_tick(0)
    ledger = ByteLedger()
    points = CompressionPoints(model, IdentityCodec(), ledger)
    with torch.no_grad(), points.session("compressed", tick=0, token_mask=mask):
        model(input_ids=ids, attention_mask=mask.long())
    assert ledger.tick_bytes["activations_forward"] == ledger.tick_dense == 2 * int(mask.sum()) * HIDDEN * 4


def test_unsupported_models_and_bad_sessions_are_rejected():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=10, n_positions=8))
    with pytest.raises(
        ValueError, match=r"GPT2LMHeadModel \(model_type='gpt2'\).*qwen2, qwen3, llama, mistral"
    ):
        CompressionPoints(gpt2, IdentityCodec(), ByteLedger())
    with pytest.raises(ValueError, match="supported"):
        CompressionPoints(nn.Linear(2, 2), IdentityCodec(), ByteLedger())
    model = tiny_qwen2()
    points = CompressionPoints(model, IdentityCodec(), ByteLedger())
    ids, mask = batch_for_tick(0)
    with pytest.raises(ValueError, match="not one of"), points.session("fast", tick=0):
        pass
    outer, inner = points.session("dense", tick=0), points.session("compressed", tick=0)
    with outer, pytest.raises(RuntimeError, match="do not nest"), inner:
        pass
    bad_mask = points.session("compressed", tick=0, token_mask=mask[:, :5])
    with pytest.raises(ValueError, match="token_mask has shape"), torch.no_grad(), bad_mask:
        model(input_ids=ids)
    assert points.mode is None  # the failed session left nothing behind


def test_activation_checkpointing_is_neither_counted_nor_sketched_twice():
    """The recomputation in backward goes through the codec (same gradients) but not into the ledger."""
    results = []
    for checkpointing in (False, True):
        model = tiny_qwen2()
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ledger, codec = ByteLedger(), LowRankActivationCodec(HIDDEN, RANK, 2, seed=0)
        points = CompressionPoints(model, codec, ledger)
        ids, mask = batch_for_tick(0)
        with points.session("compressed", tick=0, token_mask=mask):
            model(input_ids=ids, attention_mask=mask.long()).logits.square().mean().backward()
        codec.begin_sketch()
        with points.session("sketch", tick=0, token_mask=mask):
            model(input_ids=ids, attention_mask=mask.long()).logits.square().mean().backward()
        results.append((dict(ledger.tick_bytes), [p.grad for p in model.parameters()], codec.sketches))
    (bytes_plain, grads_plain, sketch_plain), (bytes_ckpt, grads_ckpt, sketch_ckpt) = results
    assert bytes_plain == bytes_ckpt
    for a, b in zip(grads_plain + sketch_plain, grads_ckpt + sketch_ckpt, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
