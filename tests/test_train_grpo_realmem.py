"""GRPO on RealMem: short episodes that start from the gold written before them, a facts-only reward, adapters trained on, flags."""

from __future__ import annotations

import json

import pytest
import trl  # noqa: F401 - the [train] extra, installed by `make dev`; missing fails the suite
from fixtures.tiny_model import tiny_llama, tiny_tokenizer
from fixtures.train_data import REALMEM_RAW
from typer.testing import CliRunner

from dualmem.datasets.realmem import parse_realmem
from dualmem.errors import ConfigurationError
from dualmem.schema import Dataset, FactOp, InsightOp, MemoryItem, MemoryUpdate
from dualmem.testing import HashEmbeddings
from dualmem.training.cli import train_app
from dualmem.training.grpo_trl import GRPORunConfig, _shared_prefill, train_grpo, training_episodes
from dualmem.training.realmem_gold import realmem_episodes
from dualmem.training.rewards import RewardConfig
from dualmem.training.rollout import Trajectory
from dualmem.training.writing import writer_context

HASH = RewardConfig(embedder="hash:64")
CTX = writer_context(embedder=HashEmbeddings(64))


def _first_prompt(ep) -> list[dict]:
    """The writer's prompt for an episode's first chunk, drafted on its starting memory."""
    return ep.memory(CTX).draft(ep.chunks[0])[0]


@pytest.fixture
def item():
    return parse_realmem(REALMEM_RAW, "Test_Person_dialogues_256k.json")


def test_episodes_hold_their_chunks_points_and_start_from_the_gold_before_them(item):
    episodes = realmem_episodes(item, window=1, chunk_tokens=120, ctx=CTX)
    points = {p.content for s in item.dialogue.sessions for p in s.memory_points}
    assert {g.text for e in episodes for g in e.gold_facts} == points
    written: list[str] = []
    for ep in episodes:
        assert len(ep.chunks) == 1 and ep.gold_facts and ep.queries == [] and ep.scored == ("fact",)
        assert all(
            ep.chunk_of(g.turn_id) == 0 for g in ep.gold_facts
        )  # each point in the chunk holding its source turn
        assert sorted(i.text for i in ep.start.active()) == sorted(
            written
        )  # the gold memory of every earlier chunk, nothing of its own
        assert len(ep.start.applied) == int(
            ep.id.split("#")[1]
        )  # the chunks written before it: its turns' seq goes on from there
        assert ep.ground_truth()["insights"] == [] and sorted(ep.ground_truth()["facts"]) == sorted(
            {g.text for g in ep.gold_facts}
        )
        written += [g.text for g in ep.gold_facts]
    whole = realmem_episodes(item, window=1_000_000, chunk_tokens=120, ctx=CTX)
    assert len(whole) == 1 and whole[0].start.items == () and {g.text for g in whole[0].gold_facts} == points
    pairs = realmem_episodes(item, window=2, chunk_tokens=120, ctx=CTX)
    assert all(len(e.chunks) <= 2 for e in pairs) and {g.text for e in pairs for g in e.gold_facts} == points
    first = realmem_episodes(item, window=1, chunk_tokens=120, max_chunks=1, ctx=CTX)
    assert [e.id for e in first] == [episodes[0].id] and episodes[0].id.endswith("#0")
    later = realmem_episodes(
        item, window=1, chunk_tokens=120, skip=1, ctx=CTX
    )  # past the chunks SFT saw: the gold before is their memory
    assert [e.id for e in later] == [e.id for e in episodes[1:]] and [(i.id, i.text) for i in later[0].start.items] == [
        (i.id, i.text) for i in episodes[1].start.items
    ]


def _play(ep, update: MemoryUpdate | str) -> dict:
    traj = Trajectory(ep.memory(CTX))
    chunk = ep.chunks[0]
    traj.record(chunk, traj.draft(chunk)[1], [], [], update if isinstance(update, str) else update.model_dump_json())
    return traj.finish(ep, HASH, embed=HashEmbeddings(64))


def test_the_reward_is_the_recall_of_the_points_the_rollout_wrote_as_facts(item):
    ep = next(
        e for e in realmem_episodes(item, window=1, chunk_tokens=120, ctx=CTX) if e.start.items
    )  # a chunk after others
    gold = ep.gold_facts[0].text
    prompt = _first_prompt(ep)[1]["content"]
    assert any(i.text in prompt for i in ep.start.items)  # the rollout sees the gold written before its window
    insight = InsightOp(op="ADD", id="M1", text="I read this as a wish for steadiness.", fact_ids=["N1"])
    hit = _play(ep, MemoryUpdate(facts=[FactOp(op="ADD", id="N1", text=gold)], insights=[insight]))
    miss = _play(
        ep,
        MemoryUpdate(
            facts=[FactOp(op="ADD", id="N1", text="Bananas ripen quickly in warm kitchens.")], insights=[insight]
        ),
    )
    as_insight = _play(
        ep,
        MemoryUpdate(
            facts=[FactOp(op="ADD", id="N1", text="Bananas ripen quickly in warm kitchens.")],
            insights=[InsightOp(op="ADD", id="M1", text=gold, fact_ids=["N1"])],
        ),
    )
    assert (
        hit["fact_recall"] == pytest.approx(1 / len(ep.gold_facts))
        and miss["fact_recall"] == 0.0
        and as_insight["fact_recall"] == 0.0
    )
    assert (
        hit["insight_recall"] is None and hit["score"] > miss["score"] + 0.2
    )  # no gold insight: insights are not scored
    assert (
        miss["penalty"] == 0.0 and miss["items"] == 1
    )  # a valid insight costs nothing; only the written facts are counted
    # the starting memory is not the rollout's: nothing written, nothing recalled, even when the start holds a point
    seeded = ep.memory(CTX)
    seeded.store.upsert([MemoryItem(id="f_seeded", namespace=ep.namespace, kind="fact", text=gold)])
    ep.start = seeded.seed()
    empty = _play(ep, MemoryUpdate())
    assert empty["fact_recall"] == 0.0 and empty["items"] == 0
    bad = _play(ep, "not json")
    assert bad["parsed_share"] == 0.0 and bad["score"] < empty["score"]


def test_realmem_windows_are_ordered_across_personas_and_cut_by_prompt_length(item):
    other = parse_realmem(
        {**REALMEM_RAW, "_metadata": {**REALMEM_RAW["_metadata"], "person_name": "Other_Person"}},
        "Other_Person_dialogues_256k.json",
    )
    data = Dataset(name="r", items=[item, other])
    cfg = GRPORunConfig(data_format="realmem", episode_chunks=1, chunk_tokens=120, memory_embedder="hash:64")
    episodes = training_episodes(data, cfg)
    ids = [e.id for e in episodes]
    assert len(ids) == 2 * len(realmem_episodes(item, window=1, chunk_tokens=120, ctx=CTX)) and ids != sorted(ids)
    assert ids == [e.id for e in training_episodes(data, cfg)]  # seeded: the same order every time
    tok = tiny_tokenizer([c["text"] for e in episodes for c in e.chunks])
    lengths = sorted(
        len(tok.apply_chat_template(_first_prompt(e), add_generation_prompt=True, tokenize=True)["input_ids"])
        for e in episodes
    )
    cut = GRPORunConfig(
        data_format="realmem",
        episode_chunks=1,
        chunk_tokens=120,
        max_prompt_tokens=lengths[len(lengths) // 2],
        memory_embedder="hash:64",
    )
    assert 0 < len(training_episodes(data, cut, tok)) < len(episodes)
    with pytest.raises(ConfigurationError, match="max_prompt_tokens"):
        training_episodes(
            data,
            GRPORunConfig(data_format="realmem", chunk_tokens=120, max_prompt_tokens=5, memory_embedder="hash:64"),
            tok,
        )


def test_one_prefill_for_a_group_with_one_prompt_gives_the_same_tokens():
    import torch

    tok = tiny_tokenizer(["The user works night shifts at a warehouse."])
    model = tiny_llama(tok)
    prompt = tok("The user works night shifts", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt] * 3)
    shared = _shared_prefill(model, [prompt] * 3, ids)
    assert "past_key_values" in shared and _shared_prefill(model, [prompt, prompt[1:]], ids) == {}
    kw = {
        "attention_mask": torch.ones_like(ids),
        "max_new_tokens": 6,
        "do_sample": False,
        "pad_token_id": tok.pad_token_id,
    }
    with torch.no_grad():
        assert torch.equal(model.generate(input_ids=ids, **kw, **shared), model.generate(input_ids=ids, **kw))


def test_grpo_on_realmem_goes_on_training_a_given_adapter_under_the_grammar(item, tmp_path):
    from peft import LoraConfig, get_peft_model

    eps = realmem_episodes(item, window=1, chunk_tokens=120, ctx=CTX)
    tok = tiny_tokenizer([m["content"] for e in eps for m in _first_prompt(e)])
    policy = get_peft_model(
        tiny_llama(tok), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    cfg = GRPORunConfig(
        output_dir=str(tmp_path / "grpo"),
        data_format="realmem",
        episode_chunks=1,
        chunk_tokens=120,
        num_generations=2,
        max_completion_length=48,
        max_steps=2,
        learning_rate=1e-3,
        use_cpu=True,
        disable_tqdm=True,
        embedder="hash:64",
        save_steps=1000,
        use_lora=True,
        grammar=True,
        beta=0.0,
        memory_embedder="hash:64",
    )
    out = train_grpo(
        cfg, dataset=Dataset(name="r", items=[item]), model=policy, tokenizer=tok, embed=HashEmbeddings(64)
    )
    assert len([h for h in out["log_history"] if "reward" in h]) == 2 and [s["step"] for s in out["steps"]] == [1, 2]
    groups = out["rollouts"]
    assert len(groups) == 2 and all(len(g["score"]) == 2 and g["chunks"] == 1 and g["gold_facts"] > 0 for g in groups)
    answers = [t for g in groups for rollout in g["texts"] for t in rollout]
    assert len(answers) == 4 and all(t.startswith('{"facts"') for t in answers)  # decoded under the writer's grammar
    saved = json.loads(
        (tmp_path / "grpo" / "adapter_config.json").read_text()
    )  # the given adapter itself, saved as an adapter
    assert (
        saved["r"] == 2 and json.loads((tmp_path / "grpo" / "dualmem_grpo_log.json").read_text())["rollouts"] == groups
    )


runner = CliRunner()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--data_format", "xml"], "--data_format 'xml': use one of rolememo, realmem"),
        (["--max_chunks", "3"], "pass --data_format realmem"),
        (["--data_format", "realmem", "--episode_chunks", "-1"], "--episode_chunks -1: a count"),
        (["--data_format", "realmem", "--max_chunks", "many"], "invalid int value: 'many'"),
    ],
)
def test_bad_grpo_flags_are_one_line_errors(flags, message):
    res = runner.invoke(train_app, ["rl", "--engine", "trl", *flags])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.output


def test_rl_cli_trains_on_realmem_files(tmp_path):
    src = tmp_path / "Test_Person_dialogues_256k.json"
    src.write_text(json.dumps(REALMEM_RAW))
    item = parse_realmem(REALMEM_RAW, src.name)
    eps = realmem_episodes(item, window=1, chunk_tokens=120, ctx=CTX)
    tok = tiny_tokenizer([m["content"] for e in eps for m in _first_prompt(e)])
    tiny_llama(tok).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    res = runner.invoke(
        train_app,
        [
            "rl",
            "--engine",
            "trl",
            "--data",
            str(src),
            "--data_format",
            "realmem",
            "--episode_chunks",
            "1",
            "--max_chunks",
            "2",
            "--model_name_or_path",
            str(tmp_path / "tiny"),
            "--chunk_tokens",
            "120",
            "--num_generations",
            "2",
            "--max_completion_length",
            "8",
            "--max_steps",
            "1",
            "--beta",
            "0",
            "--use_cpu",
            "true",
            "--disable_tqdm",
            "true",
            "--embedder",
            "hash:64",
            "--output_dir",
            str(tmp_path / "out"),
            "--memory_embedder",
            "hash:64",
        ],
    )
    assert res.exit_code == 0, res.output
    log = json.loads((tmp_path / "out" / "dualmem_grpo_log.json").read_text())
    assert [g["episode"] for g in log["rollouts"]] and all(
        g["episode"].startswith("Test_Person#") for g in log["rollouts"]
    )
    assert all(
        int(g["episode"].split("#")[1]) < 2 for g in log["rollouts"]
    )  # --max_chunks 2: windows of the first two chunks only


def test_local_adapters_load_merged_or_as_the_trainable_adapter(tmp_path):
    import torch
    from fixtures.tiny_model import random_smollm2_adapter

    from dualmem.training.sft import SFTRunConfig, load_model_and_tokenizer

    tok = random_smollm2_adapter(tmp_path / "adapter")
    name = f"local:{tmp_path / 'adapter'}"
    trainable, _ = load_model_and_tokenizer(SFTRunConfig(model_name_or_path=name, use_lora=True))
    merged, _ = load_model_and_tokenizer(SFTRunConfig(model_name_or_path=name))
    assert hasattr(trainable, "peft_config") and not hasattr(merged, "peft_config")
    assert {n for n, p in trainable.named_parameters() if p.requires_grad} and all(
        "lora_" in n for n, p in trainable.named_parameters() if p.requires_grad
    )
    assert merged.config._name_or_path == name  # a KL reference is built from these weights, not from the base's folder
    ids = tok("User is learning R.", return_tensors="pt")["input_ids"]
    trainable.eval()
    with torch.no_grad():
        assert torch.allclose(trainable(ids).logits, merged(ids).logits, atol=1e-3)
    with pytest.raises(ConfigurationError, match="--model_name_or_path local:nope: unknown local model 'nope'"):
        load_model_and_tokenizer(SFTRunConfig(model_name_or_path="local:nope"))
