"""Counters other than the simulator's: a local tokenizer.json, the estimate, their labels."""

from __future__ import annotations

import json

import pytest

from soak.errors import WorkloadError
from soak.tokens import chat
from soak.workload import EstimateCounter, LocalTokenizerCounter, build_workload, make_counter
from soak.workload.config import EstimateTokenizer, LocalTokenizer, SyntheticAgenticConfig

from .test_agentic import SMALL

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture
def tokenizer_json(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    lines = open(json.__file__, encoding="utf-8").read().splitlines() * 3
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


async def test_a_local_tokenizer_sizes_turns_close_to_its_own_whole_prompt_count(tokenizer_json):
    counter = make_counter(LocalTokenizer(path=tokenizer_json), target_is_simulator=False)
    assert isinstance(counter, LocalTokenizerCounter) and counter.label.startswith("exact (local tokenizer")
    workload = build_workload(SyntheticAgenticConfig.model_validate(SMALL), base_dir=".", seed=2, model="m")
    await workload.calibrate(counter)
    session = workload.new_session(0)
    for _ in range(3):
        turn = session.next_turn()
        body = json.loads(turn.body)
        actual = counter.count_text_sync(chat.render_chat(body["messages"], body["tools"]))
        assert abs(actual - turn.planned_prompt_tokens) <= 0.01 * actual
    plan = workload.plan(duration_s=300, concurrency=2)
    assert plan.counter == counter.label
    assert any("whole-prompt counts" in note for note in plan.notes)


def test_a_missing_tokenizer_file_names_the_field(tmp_path):
    with pytest.raises(WorkloadError) as info:
        make_counter(LocalTokenizer(path=tmp_path / "nope.json"), target_is_simulator=False, config_path="run.yaml")
    assert "tokenizer.path" in str(info.value) and "run.yaml" in str(info.value)


async def test_the_estimate_says_it_is_one():
    counter = make_counter(EstimateTokenizer(chars_per_token=4), target_is_simulator=False)
    assert isinstance(counter, EstimateCounter) and "estimate" in counter.label and "not exact" in counter.label
    assert await counter.count_text("x" * 400) == 100
    # auto without a server and not the simulator: an estimate, never a silent guess called exact
    assert "estimate" in make_counter(None, target_is_simulator=False).label
