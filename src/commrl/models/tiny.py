"""The tiny world's model: a small Qwen2-architecture causal LM and a character-level tokenizer.

The tokenizer has one token per byte (the 256 symbols of GPT-2's byte-level alphabet, no merges) plus
three chat specials. Its vocabulary is stored in byte-level form (space as ``Ġ``, newline as ``Ċ``): for a
directory whose config says ``model_type: qwen2``, transformers 5's ``AutoTokenizer`` rebuilds the
tokenizer as ``Qwen2Tokenizer`` with Qwen's byte-level pipeline, and a plain character vocabulary would
then lose every space without an error. Stored this way, the saved directory loads identically through
``AutoTokenizer``, lm-eval's hf backend and vLLM.

The default shape (hidden 128, 4 heads of size 32, 2 KV heads, 4 layers) is the smallest that vLLM's CPU
attention accepts (head sizes 32, 64, 80, ...; its Qwen2 ignores a ``head_dim`` override).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class TinyModelShape:
    """Shape of the tiny Qwen2 policy. ``hidden_size / num_attention_heads`` must be a vLLM CPU head size."""

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 512

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by "
                f"model.num_attention_heads={self.num_attention_heads}"
            )
        head = self.hidden_size // self.num_attention_heads
        if head not in VLLM_CPU_HEAD_SIZES:
            raise ValueError(
                f"head size hidden_size/num_attention_heads = {head} is not one vLLM's CPU attention supports"
                f" {VLLM_CPU_HEAD_SIZES}; change model.hidden_size or model.num_attention_heads"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("model.num_attention_heads must be a multiple of model.num_key_value_heads")


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode map, in byte order: the 256 printable stand-ins for raw bytes."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def build_char_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """One token per byte, specials first (ids 0..2), then the 256 byte-level symbols (ids 3..258)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for symbol in byte_level_alphabet():
        vocab[symbol] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def build_tiny_model(
    shape: TinyModelShape, tokenizer: PreTrainedTokenizerFast, seed: int = 0
) -> Qwen2ForCausalLM:
    """A randomly initialised fp32 ``Qwen2ForCausalLM`` of the given shape (deterministic by seed)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        rope_theta=10000.0,
        architectures=["Qwen2ForCausalLM"],
        **asdict(shape),
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    return model


def save_model_dir(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> Path:
    """Save model and tokenizer so that the Auto classes, lm-eval and vLLM load them from ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
