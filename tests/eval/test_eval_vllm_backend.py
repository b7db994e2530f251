"""lm-eval's ``vllm`` backend on CPU: the distribution alias and the CPU environment."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from commrl.eval import EvalError, vllm_backend
from commrl.eval.pairs import pair_settings
from commrl.eval.runner import backend_model_args
from commrl.rl.vllm_env import CPU_MAX_NUM_SEQS, cpu_engine_args, vllm_distribution

TINY_BASE = Path(__file__).resolve().parents[2] / "assets" / "tiny-base"

CPU_VARS = (
    "VLLM_CPU_KVCACHE_SPACE",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "OMP_NUM_THREADS",
    "VLLM_CPU_OMP_THREADS_BIND",
)


def test_aliased_version_answers_vllm_with_the_cpu_build():
    versions = {"vllm-cpu": "0.31.0", "torch": "2.13.0"}
    version = vllm_backend.aliased_version(versions.__getitem__)
    assert version("vllm") == "0.31.0+cpu" and version("VLLM") == "0.31.0+cpu"
    assert version("torch") == "2.13.0"


@pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="needs the vllm-cpu distribution without vllm")
def test_alias_is_installed_only_for_vllm_cpu(monkeypatch):
    unaliased = getattr(importlib.metadata.version, "__wrapped__", importlib.metadata.version)
    monkeypatch.setattr(importlib.metadata, "version", unaliased)  # restored after the test
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")
    assert vllm_backend.alias_vllm_cpu() is True
    assert importlib.metadata.version("vllm") == importlib.metadata.version("vllm-cpu") + "+cpu"
    assert importlib.metadata.version("lm_eval") == "0.4.13"
    assert vllm_backend.alias_vllm_cpu() is True  # idempotent: no second wrapper
    assert importlib.metadata.version("vllm").count("+cpu") == 1
    assert importlib.metadata.version.__wrapped__ is unaliased


@pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="needs the vllm-cpu distribution without vllm")
def test_prepare_sets_the_cpu_variables_and_keeps_existing_ones(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", importlib.metadata.version)
    for name in CPU_VARS:
        monkeypatch.delenv(name, raising=False)
    vllm_backend.prepare_vllm()
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ  # the engine arguments size the cache
    assert [os.environ[name] for name in CPU_VARS[1:]] == ["0", "2", "nobind"]
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    vllm_backend.prepare_vllm()
    assert [os.environ[name] for name in CPU_VARS] == ["3", "0", "2", "nobind"]


def test_the_cpu_kv_cache_holds_every_sequence_at_full_length_and_no_more(tmp_path):
    """256 sequences of max_model_len tokens (whole 16-token blocks, one more each), 2 L H_kv d values a
    token: the tiny base (4 layers, 2 key-value heads of 32, float32) at 512 tokens is 264 MiB, not the
    1 GiB every CPU engine zeroed before; a large model stops at the ceiling."""
    tiny_token = 2 * 4 * 2 * 32 * 4
    args = cpu_engine_args(TINY_BASE, 512, "float32", cap_gib=1)
    assert args == {"max_num_seqs": CPU_MAX_NUM_SEQS, "kv_cache_memory_bytes": 256 * 528 * tiny_token}
    assert args["kv_cache_memory_bytes"] == 264 * 2**20
    assert cpu_engine_args(TINY_BASE, 500, "auto", 1) == args  # 500 tokens: 32 blocks; auto: config's float32
    half = cpu_engine_args(TINY_BASE, 512, "bfloat16", 1)
    assert half["kv_cache_memory_bytes"] == 256 * 528 * tiny_token // 2
    qwen = {"num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "hidden_size": 1536}
    (tmp_path / "config.json").write_text(json.dumps({**qwen, "torch_dtype": "bfloat16"}))
    assert cpu_engine_args(tmp_path, 4096, "auto", 1)["kv_cache_memory_bytes"] == 2**30
    short = cpu_engine_args(tmp_path, 32, "auto", 1)  # 3 blocks of 28 layers x 2 heads of 128, bfloat16
    assert short["kv_cache_memory_bytes"] == 256 * 48 * 2 * 28 * 2 * 128 * 2


@pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="needs the vllm-cpu distribution without vllm")
def test_an_evaluation_on_the_cpu_sizes_its_kv_cache_to_the_pair():
    args = backend_model_args("vllm", TINY_BASE, pair_settings("tiny"))
    assert args["max_num_seqs"] == CPU_MAX_NUM_SEQS
    assert args["kv_cache_memory_bytes"] == 264 * 2**20  # the tiny pair: float32, max_model_len 512
    assert args["max_model_len"] == 512


def test_the_inductor_cache_is_one_per_cpu_capability(monkeypatch):
    """vLLM's compiled sampler from a cache built under another ATEN_CPU_CAPABILITY corrupted memory here
    (noise completions, or `double free or corruption`; reproduced by running `commrl eval` on an avg@k
    benchmark with ATEN_CPU_CAPABILITY=avx2, then without, both with one TORCHINDUCTOR_CACHE_DIR)."""
    from commrl.rl import vllm_env

    for name in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY"):  # restored as they were at teardown
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    default = vllm_env.inductor_cache_dir()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2")
    avx2 = vllm_env.inductor_cache_dir()
    assert default.endswith("commrl-default") and avx2.endswith("commrl-avx2")
    assert os.path.dirname(default) == os.path.dirname(avx2)
    vllm_env.configure_cpu_vllm()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == avx2
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    vllm_env.configure_cpu_vllm()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere"  # a value of the user's wins


def test_missing_vllm_is_a_clear_error(monkeypatch):
    """No vLLM distribution is simulated (both are installed here)."""
    monkeypatch.setattr(vllm_backend, "vllm_distribution", lambda: None)
    with pytest.raises(EvalError, match=r"--backend vllm needs vLLM.*vllm-cpu.*--backend hf"):
        vllm_backend.prepare_vllm()


class _Engine:
    """Stands in for a vLLM engine (a broken sampling path cannot be made on demand; the check's pass path on
    the real engine runs in test_eval_tiny_model's vLLM suite): greedy completions are each prompt's
    length; sampled ones equal them on the first ``agree`` prompts."""

    def __init__(self, agree: int):
        self.agree, self.prompts = agree, []

    def generate(self, prompts, params, use_tqdm=True):
        from types import SimpleNamespace

        self.prompts.append(list(prompts))
        greedy = params.temperature == 0.0
        ids = [[len(p)] if greedy or i < self.agree else [-1] for i, p in enumerate(prompts)]
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=t)]) for t in ids]


class _Model:
    """Stands in for lm-eval's vLLM model around ``_Engine``: its tokenizer has a chat template, and its
    ``apply_chat_template`` renders a user turn as lm-eval renders a benchmark's prompt."""

    def __init__(self, engine: _Engine):
        from types import SimpleNamespace

        self.model, self.tokenizer = engine, SimpleNamespace(chat_template="{{ messages }}")

    def apply_chat_template(self, chat_history, add_generation_prompt=True):
        assert add_generation_prompt
        return f"<user>{chat_history[0]['content']}<assistant>"


@pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="the check runs on CPU engines only")
@pytest.mark.parametrize("agree", [8, 4])
def test_a_sound_sampling_path_passes_the_check(agree):
    engine = _Engine(agree)
    vllm_backend.check_sampling(_Model(engine))
    assert engine.prompts[0][1] == "<user>12+34=<assistant>" and engine.prompts[0] == engine.prompts[1]


@pytest.mark.skipif(vllm_distribution() != "vllm-cpu", reason="the check runs on CPU engines only")
def test_a_sampling_path_apart_from_greedy_is_refused_with_the_fix():
    lm = _Model(_Engine(3))
    assert vllm_backend.sampling_agreement(lm.model, list(vllm_backend.CANARY_PROMPTS)) == 3 / 8
    with pytest.raises(
        EvalError, match=r"disagrees with its greedy one at T=0\.01 on 62% of 8 prompts.*--backend hf"
    ):
        vllm_backend.check_sampling(lm)
