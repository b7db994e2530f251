import torch

from commrl.rl.batch import build_batch, micro_batches
from commrl.rl.checkpoint import CheckpointStore
from commrl.rl.sampler import Completion
from commrl.rl.trainer import tick_prompt_indices


def test_layout_left_pads_prompts_and_right_pads_responses():
    prompts = [[5, 6, 7], [8]]
    groups = [[Completion([1, 2], [-0.1, -0.2])], [Completion([3], [-0.3]), Completion([], [])]]
    b = build_batch(prompts, groups, pad_id=0, tick=4)
    assert b.input_ids.tolist() == [[5, 6, 7, 1, 2], [0, 0, 8, 3, 0], [0, 0, 8, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 0, 1, 0, 0]]
    assert b.position_ids[1].tolist() == [0, 0, 0, 1, 1]
    assert b.response_mask.tolist() == [[1, 1], [1, 0], [0, 0]]
    assert torch.allclose(b.sampler_log_probs[0], torch.tensor([-0.1, -0.2]))
    assert list(b.uids) == ["t4-p0", "t4-p1", "t4-p1"]


def test_micro_batch_ids_are_global_and_stable():
    prompts = [[1]] * 4
    groups = [[Completion([2], [-1.0])] * 2 for _ in prompts]
    b = build_batch(prompts, groups, 0, 0)
    ids = [i for i, _ in micro_batches(b, 2, start=4, stop=8)]
    assert ids == [2, 3]


def test_tick_prompts_are_a_pure_function_covering_each_epoch():
    first = [i for t in range(5) for i in tick_prompt_indices(10, 2, t, seed=3)]
    assert sorted(first) == list(range(10))
    assert tick_prompt_indices(10, 4, 7, seed=3) == tick_prompt_indices(10, 4, 7, seed=3)
    assert tick_prompt_indices(10, 4, 1, seed=3) != tick_prompt_indices(10, 4, 1, seed=4)


def test_checkpoint_store_keeps_the_newest(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for t in (5, 10, 15):
        store.save(t, {"tick": t, "x": torch.tensor([t])})
    assert store.ticks() == [10, 15]
    tick, state = store.load_latest()
    assert tick == 15 and int(state["x"]) == 15
    (tmp_path / "tick_000020").mkdir()  # an incomplete checkpoint (no state.pt) is ignored
    assert store.load_latest()[0] == 15
    (tmp_path / ".tmp_tick_killed").mkdir()  # a kill while a checkpoint was written
    store.save(25, {"tick": 25})
    assert not (tmp_path / ".tmp_tick_killed").exists() and store.ticks() == [15, 25]
