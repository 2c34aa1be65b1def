"""RealMem gold as writer SFT data: points at their source turn, insights out of the loss; LoRA adapters as local models."""

from __future__ import annotations

import json

import pytest
from fixtures.train_data import REALMEM_RAW as RAW
from typer.testing import CliRunner

from dualmem.datasets.realmem import parse_realmem
from dualmem.errors import ConfigurationError
from dualmem.schema import Dataset, MemoryUpdate
from dualmem.testing import HashEmbeddings
from dualmem.training.export import export_sft, validate_record
from dualmem.training.realmem_gold import facts_prefix, item_records, point_turns
from dualmem.training.sft import read_records, tokenize_pairs
from dualmem.training.writing import writer_context

CTX = writer_context(embedder=HashEmbeddings(64))


@pytest.fixture
def item():
    return parse_realmem(RAW, "Test_Person_dialogues_256k.json")


def test_each_point_is_written_in_the_chunk_holding_its_source_turn(item):
    at = point_turns(item.dialogue.sessions)
    assert at["u1:0"] == [("S1-01", "User is learning R for their thesis.")]  # source_turn is 1-based
    assert at["u1:2"] == [("S1-02", "User prefers open-source tools.")]
    assert at["u1:4"] == [("S1-03", "User has a cat named Miso.")]  # no such turn: the session's last user turn
    records = item_records(item, ctx=CTX, chunk_tokens=120, keep_empty=1.0)
    written = {}
    for rec in records:
        assert validate_record(rec) == [] and rec["loss_scope"] == "facts"
        target = MemoryUpdate.model_validate_json(rec["messages"][-1]["content"])
        assert target.insights == []
        chunk = rec["messages"][-2]["content"].split("## CONVERSATION CHUNK")[-1]
        for fact in target.facts:
            assert fact.op == "ADD" and fact.turn_ids and all(f"[{t}]" in chunk for t in fact.turn_ids)
            written[fact.text] = rec["chunk_id"]
    assert set(written) == {p.content for s in item.dialogue.sessions for p in s.memory_points}
    # later chunks show what was written before in their working view
    last = records[-1]["messages"][-2]["content"].split("## CONVERSATION CHUNK")[0]
    assert "User moved to Lyon in 2024." in last or "User is learning R" in last


def test_max_chunks_and_empty_chunks(item):
    every = item_records(item, ctx=CTX, chunk_tokens=120, keep_empty=1.0)
    assert len(item_records(item, ctx=CTX, chunk_tokens=120, keep_empty=1.0, max_chunks=2)) == 2
    assert all(
        json.loads(r["messages"][-1]["content"])["facts"]
        for r in item_records(item, ctx=CTX, chunk_tokens=120, keep_empty=0.0)
    )
    assert len(every) > len(item_records(item, ctx=CTX, chunk_tokens=120, keep_empty=0.0))


def test_export_and_read_keep_the_loss_scope(item, tmp_path):
    report = export_sft(
        tmp_path / "sft",
        realmem=Dataset(name="realmem", source="x", items=[item]),
        chunk_tokens=120,
        eval_ratio=0,
        embedder=HashEmbeddings(64),
    )
    assert report.train > 0 and report.by_source == {"realmem-gold": report.train} and not report.invalid
    rows = read_records(tmp_path / "sft" / "train.jsonl")
    assert {r["loss_scope"] for r in rows} == {"facts"}


def test_cli_exports_realmem(tmp_path):
    from dualmem.cli import app

    src = tmp_path / "Test_Person_dialogues_256k.json"
    src.write_text(json.dumps(RAW))
    res = CliRunner().invoke(
        app,
        [
            "train",
            "export-sft",
            "--realmem",
            str(src),
            "--out",
            str(tmp_path / "o"),
            "--eval-ratio",
            "0",
            "--chunk-tokens",
            "120",
            "--embedder",
            "hash:64",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "realmem-gold" in res.output and (tmp_path / "o" / "train.jsonl").read_text().count("\n") > 0


@pytest.fixture(scope="module")
def smol_tokenizer():
    from dualmem.models.local.bundled import load_transformers

    return load_transformers("smollm2")[1]


def test_facts_scope_trains_on_the_facts_part_only(item, smol_tokenizer):
    rec = next(
        r for r in item_records(item, ctx=CTX, chunk_tokens=120) if json.loads(r["messages"][-1]["content"])["facts"]
    )
    row = {"prompt": rec["messages"][:-1], "completion": rec["messages"][-1:]}
    target = rec["messages"][-1]["content"]
    (facts,) = tokenize_pairs([{**row, "loss_scope": "facts"}], smol_tokenizer, 4096)
    (full,) = tokenize_pairs([{**row, "loss_scope": "all"}], smol_tokenizer, 4096)
    assert facts["input_ids"] == full["input_ids"]
    trained = smol_tokenizer.decode([t for t in facts["labels"] if t != -100])
    assert trained == target[: facts_prefix(target)]  # up to and with the "insights": key, nothing of its value
    everything = smol_tokenizer.decode([t for t in full["labels"] if t != -100])
    assert everything.startswith(target) and len(everything) > len(
        target
    )  # "all": the whole answer and the end of turn
    prompt_len = sum(1 for t in full["labels"] if t == -100)
    assert smol_tokenizer.decode(full["input_ids"][:prompt_len]).endswith(
        "assistant\n"
    )  # the prompt is never trained on


def test_records_longer_than_max_length_are_left_out(item, smol_tokenizer, caplog):
    rows = [
        {"prompt": r["messages"][:-1], "completion": r["messages"][-1:], "loss_scope": "facts"}
        for r in item_records(item, ctx=CTX, chunk_tokens=120)
    ]
    lengths = [len(x["input_ids"]) for x in tokenize_pairs(rows, smol_tokenizer, 10_000)]
    cut = sorted(lengths)[len(lengths) // 2]
    kept = tokenize_pairs(rows, smol_tokenizer, cut)
    assert len(kept) == sum(n <= cut for n in lengths) < len(rows) and "left out" in caplog.text
    with pytest.raises(ConfigurationError, match="max_length"):
        tokenize_pairs(rows, smol_tokenizer, 10)


def test_a_lora_adapter_folder_is_a_local_model(tmp_path):
    """local:<adapter folder> merges the adapter into its own copy of the base; the bundled base is untouched."""
    import torch
    from fixtures.tiny_model import random_smollm2_adapter

    from dualmem.models.local.bundled import load_transformers
    from dualmem.models.local.model import load_local_chat_model

    tok = random_smollm2_adapter(tmp_path / "adapter")
    model = load_local_chat_model(str(tmp_path / "adapter"), engine="auto", max_new_tokens=8)
    assert model.engine == "transformers" and "LoRA" in model.model_name
    ids = tok("User is learning R.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        plain = load_transformers("smollm2")[0](ids).logits
        tuned = load_transformers(str(tmp_path / "adapter"))[0](ids).logits
        again = load_transformers("smollm2")[0](ids).logits
    assert not torch.allclose(plain, tuned, atol=1e-3) and torch.equal(plain, again)
    assert model.invoke("Say hi.").content is not None


def test_bad_local_names_and_engines_are_one_line_errors(tmp_path, monkeypatch):
    from dualmem.models.local.model import load_local_chat_model

    with pytest.raises(ConfigurationError, match="unknown local model 'gpt5'.*local:smollm2-writer"):
        load_local_chat_model("gpt5")
    with pytest.raises(ConfigurationError, match="unknown local model"):
        load_local_chat_model(str(tmp_path))  # a folder without adapter_config.json
    (tmp_path / "adapter_config.json").write_text("{}")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "llama_cpp" else object())
    with pytest.raises(ConfigurationError, match=r"dualmem\[llamacpp\].*DUALMEM_LOCAL_ENGINE=transformers") as err:
        load_local_chat_model(str(tmp_path), engine="llama.cpp")  # an adapter runs on llama.cpp once it is installed
    assert "\n" not in str(err.value)


def test_a_trained_adapter_gets_the_writer_prompt_it_was_trained_on(tmp_path, monkeypatch):
    """The base model's structured calls carry a schema hint; an adapter's do not (its SFT prompts had none)."""
    from dualmem.models.local.bundled import usage
    from dualmem.models.local.model import LocalChatModel

    (tmp_path / "adapter_config.json").write_text("{}")
    seen: list[str] = []

    def fake_run(self, messages, stop=None, schema_json=None):
        seen.append(messages[-1].content)
        return '{"facts":[],"insights":[]}', usage(1, 1)

    monkeypatch.setattr(LocalChatModel, "_run", fake_run)
    for name in ("smollm2", str(tmp_path)):
        assert LocalChatModel(name_=name).with_structured_output(MemoryUpdate).invoke("the chunk") == MemoryUpdate()
    assert (
        seen[0].startswith("the chunk\n\nAnswer with one JSON object matching this schema") and seen[1] == "the chunk"
    )


def test_the_shipped_writer_adapter_loads_and_changes_the_model():
    """local:smollm2-writer: the LoRA of benchmarks/writer_sft.py, shipped packed (int8 + scales, xz) in dualmem/data/writer_lora."""
    import torch

    from dualmem.models.local.bundled import PACKED, adapter_dir, load_transformers
    from dualmem.models.local.model import load_local_chat_model

    folder = adapter_dir("smollm2-writer")
    assert folder is not None and (folder / PACKED).stat().st_size < 5_000_000
    model = load_local_chat_model("smollm2-writer", max_new_tokens=8)
    assert model.engine == "transformers"
    base, tok = load_transformers("smollm2")
    ids = tok("User is learning R.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert not torch.allclose(base(ids).logits, load_transformers("smollm2-writer")[0](ids).logits, atol=1e-3)


def test_a_packed_adapter_unpacks_within_one_percent(tmp_path):
    import torch
    from safetensors.torch import save_file

    from dualmem.models.local.bundled import pack_adapter, packed_adapter

    source = tmp_path / "adapter"
    source.mkdir()
    (source / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4}')
    gen = torch.Generator().manual_seed(0)
    weights = {
        "m.q_proj.lora_A.weight": torch.randn(4, 64, generator=gen).half(),
        "m.q_proj.lora_B.weight": (torch.randn(32, 4, generator=gen) * 1e-3).half(),
    }
    save_file(weights, str(source / "adapter_model.safetensors"))
    pack_adapter(source, tmp_path / "packed")
    assert packed_adapter(source) is None  # a plain peft folder loads as before
    back = packed_adapter(tmp_path / "packed")
    assert back is not None and set(back) == set(weights)
    for key, w in weights.items():
        assert back[key].shape == w.shape and float((back[key] - w.float()).norm() / w.float().norm()) < 0.01
