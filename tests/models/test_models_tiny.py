"""The tiny model and its character tokenizer survive save -> AutoModelForCausalLM / AutoTokenizer.

transformers 5 rebuilds a ``qwen2`` directory's tokenizer as ``Qwen2Tokenizer`` (field note
tiny-tokenizer.md); a plain character vocabulary would then lose every space without an error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from commrl.models.tiny import TinyModelShape, build_char_tokenizer, build_tiny_model, save_model_dir

TEXTS = [
    "47+18=",
    "So $x = \\boxed{\\frac{1}{2}}$.\n\nDone.",
    "  two  spaces, a tab\tand {braces} \\ back\\slash\n",
    "Unicode: π ≈ 3.14159, naïve café",
    "<|im_start|>user\n12+3=<|im_end|>\n<|im_start|>assistant\n\\boxed{15}<|im_end|>",
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module, object]:
    tok = build_char_tokenizer()
    model = build_tiny_model(TinyModelShape(), tok, seed=3)
    out = save_model_dir(model, tok, tmp_path_factory.mktemp("tiny") / "model")
    return out, model, tok


def test_tokenizer_round_trips_through_auto_tokenizer(saved: tuple) -> None:
    out, _, built = saved
    loaded = AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = built.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids, text
        assert loaded.decode(ids) == text
        assert built.decode(ids) == text
    assert len(built.encode("a b\nc", add_special_tokens=False)) == 5  # one token per byte
    assert (loaded.eos_token, loaded.pad_token, loaded.padding_side) == (
        "<|im_end|>",
        "<|endoftext|>",
        "left",
    )
    chat = [{"role": "user", "content": "1+2="}]
    assert loaded.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    )


def test_model_round_trips_through_auto_model(saved: tuple) -> None:
    out, model, tok = saved
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert loaded.config.model_type == "qwen2"
    assert (loaded.config.hidden_size, loaded.config.num_hidden_layers) == (128, 4)
    ids = torch.tensor([tok.encode(TEXTS[1], add_special_tokens=False)])
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
