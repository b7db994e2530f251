"""Compression points: forward hooks on the outputs of decoder layers (method.md §2, ``method.points``).

Supported: Hugging Face causal LMs with the Llama layout, ``model.model.layers[i]`` (Qwen2, Qwen3, Llama,
Mistral). FSDP2's ``fully_shard`` keeps that module tree, so the hooks work on sharded models too.

Modes (set for the duration of a ``session``):

- ``compressed``: the layer output ``A`` becomes the codec's ``A_hat``;
- ``dense``: ``A`` passes unchanged (bytes counted dense);
- ``sketch``: ``A`` passes unchanged and the low-rank codec accumulates ``S += A^T (A Q)``;
- outside a session the hooks do nothing and count nothing (generation, evaluation).

A session opened with ``count=False`` (the controller's diagnostic pass through the codec at a fire tick)
applies the codec but adds nothing to the ledger: those bytes would not cross in a real run.

A token mask (B x T, True = real token) excludes padding from the sketch and the byte counts. It is the
session's ``token_mask`` when given, else the 2-D ``attention_mask`` the decoder stack (``model.model``)
receives in that forward (a pre-hook reads it), else none: every position counts (packed inputs).
Bytes: forward when the hook runs, backward when the output's gradient arrives
(a tensor hook, registered when the output requires grad). A layer that returns a tuple keeps its tail.
Under activation checkpointing the recomputation in backward goes through the codec again (it must: the
recomputed output is what the gradient flows through) but is neither counted nor sketched twice; the
backward must then run inside the session, as the driver loop in ``anchor.py`` does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from commrl.compression.activation import ActivationCodec, LowRankActivationCodec
from commrl.compression.ledger import ByteLedger

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")
MODES = ("compressed", "dense", "sketch")


def in_backward() -> bool:
    """True while autograd runs a backward pass (e.g. an activation-checkpoint recomputation)."""
    return torch._C._current_graph_task_id() != -1


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """``model.model.layers`` of a supported causal LM; anything else is rejected with the supported list."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if model_type not in SUPPORTED_MODEL_TYPES or not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(
            f"cannot place compression points on {type(model).__name__} (model_type={model_type!r}): "
            "supported "
            f"are Hugging Face causal LMs of type {', '.join(SUPPORTED_MODEL_TYPES)} with decoder layers at "
            "model.model.layers"
        )
    return layers


class CompressionPoints:
    """The hooks on the chosen decoder layers, their mode, and the counting they feed into a ``ByteLedger``.

    ``layers``: the indices of the decoder layers whose output is a compression point (default: every
    layer); point ``i`` (the codec's basis ``i``, the PRF key's layer) sits on ``layers[i]``.
    """

    def __init__(
        self,
        model: nn.Module,
        codec: ActivationCodec,
        ledger: ByteLedger,
        layers: Sequence[int] | None = None,
    ) -> None:
        decoder = decoder_layers(model)
        self.layer_ids = list(range(len(decoder))) if layers is None else list(layers)
        if not self.layer_ids or any(not 0 <= i < len(decoder) for i in self.layer_ids):
            raise ValueError(
                f"compression points on layers {self.layer_ids} do not fit a model with {len(decoder)} "
                "decoder layers"
            )
        self.layers = [decoder[i] for i in self.layer_ids]
        self.hidden = int(model.config.hidden_size)
        self.codec, self.ledger = codec, ledger
        self.mode: str | None = None
        self.tick = 0
        self.microbatch = 0
        self.session_mask: Tensor | None = None
        self.counting = True
        self.token_mask: Tensor | None = None
        self.tokens: int | None = None
        self.tokens_compressed = 0  # tokens through compressed forwards (counted once per forward)
        self.activation_element_size = 4
        self._handles = [
            layer.register_forward_hook(partial(self._hook, i)) for i, layer in enumerate(self.layers)
        ]
        self._handles.append(
            model.model.register_forward_pre_hook(self._read_attention_mask, with_kwargs=True)
        )

    def __len__(self) -> int:
        return len(self.layers)

    def remove(self) -> None:
        """Detach every hook (the model is plain again)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @contextmanager
    def session(
        self,
        mode: str,
        tick: int,
        microbatch: int = 0,
        token_mask: Tensor | None = None,
        count: bool = True,
    ) -> Iterator[None]:
        """Hooks active in ``mode`` for the forward passes (and their backward) run inside; ``count=False``
        leaves the ledger (and ``tokens_compressed``) untouched."""
        if mode not in MODES:
            raise ValueError(f"compression mode {mode!r} is not one of {', '.join(MODES)}")
        if self.mode is not None:
            raise RuntimeError(f"a {self.mode!r} session is already active; sessions do not nest")
        if token_mask is not None and (token_mask.dim() != 2 or token_mask.dtype != torch.bool):
            raise ValueError(
                "token_mask must be a (batch, tokens) bool tensor, got "
                f"{tuple(token_mask.shape)} {token_mask.dtype}"
            )
        self.mode, self.tick, self.microbatch, self.counting = mode, tick, microbatch, count
        self._set_mask(token_mask)
        self.session_mask = token_mask
        try:
            yield
        finally:
            self.mode, self.session_mask, self.counting = None, None, True
            self._set_mask(None)

    def _set_mask(self, mask: Tensor | None) -> None:
        self.token_mask = mask
        self.tokens = int(mask.sum()) if mask is not None else None

    def _read_attention_mask(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Per forward: without a session mask, the padding mask is the decoder stack's 2-D attention mask."""
        if self.mode is None or self.session_mask is not None:
            return
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        if isinstance(mask, Tensor) and mask.dim() == 2:
            self._set_mask(mask.bool())
        else:
            self._set_mask(None)

    def _count_tokens(self, A: Tensor) -> int:
        if self.token_mask is None:
            return A.numel() // A.shape[-1]
        if tuple(self.token_mask.shape) != tuple(A.shape[:-1]):
            raise ValueError(
                f"token_mask has shape {tuple(self.token_mask.shape)} but the layer output is "
                f"{tuple(A.shape)}; "
                "pass the (batch, tokens) attention mask of this forward (or None for packed inputs)"
            )
        return self.tokens

    def _hook(self, point: int, module: nn.Module, args: Any, output: Any) -> Any:
        if self.mode is None:
            return None
        A = output[0] if isinstance(output, tuple) else output
        if in_backward():  # checkpoint recomputation: the same map, not counted or sketched again
            if self.mode != "compressed":
                return None
            return _replace_output(output, self.codec.apply(A, point, self.tick, self.microbatch))
        tokens = self._count_tokens(A)
        dense_elements = float(tokens * self.hidden)
        if self.mode == "compressed":
            A_hat = self.codec.apply(A, point, self.tick, self.microbatch)
            elements = self.codec.wire_elements(tokens, self.hidden)
            if point == 0 and self.counting:
                self.tokens_compressed += tokens
        else:
            if self.mode == "sketch" and isinstance(self.codec, LowRankActivationCodec):
                mask = self.token_mask.to(A.device) if self.token_mask is not None else None
                self.codec.accumulate(point, A, mask)
            A_hat, elements = A, dense_elements
        esize = A.element_size()
        self.activation_element_size = esize
        if not self.counting:
            return None if A_hat is A else _replace_output(output, A_hat)
        self.ledger.add("activations_forward", elements * esize, dense_elements * esize)
        if A_hat.requires_grad:
            A_hat.register_hook(partial(self._count_backward, elements, dense_elements))
        return None if A_hat is A else _replace_output(output, A_hat)

    def _count_backward(self, elements: float, dense_elements: float, grad: Tensor) -> None:
        esize = grad.element_size()
        self.ledger.add("activations_backward", elements * esize, dense_elements * esize)


def _replace_output(output: Any, A_hat: Tensor) -> Any:
    """The layer's output with its hidden states replaced (a tuple keeps its tail)."""
    return (A_hat, *output[1:]) if isinstance(output, tuple) else A_hat
