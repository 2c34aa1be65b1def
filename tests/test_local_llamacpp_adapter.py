"""The shipped LoRA writer on the llama.cpp engine: the GGUF adapter file written for it, and llama.cpp applying it.

The file's tests need only the ``gguf`` package (a core dependency); the engine test needs llama.cpp (an extra).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from dualmem.models.local import llamacpp
from dualmem.models.local.bundled import adapter_dir, bundled_gguf_path, load_transformers, packed_adapter

LAYER = "base_model.model.model.layers.3"
HEADS = (9, 3)  # SmolLM2-135M's attention and key-value heads (read by llama.cpp when it is installed)


def test_the_adapter_file_holds_the_adapters_factors_under_llama_cpp_names(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALMEM_CACHE", str(tmp_path))
    path = llamacpp.adapter_gguf("smollm2-writer", HEADS)
    assert path.parent == tmp_path / "adapters"
    reader = GGUFReader(str(path))
    assert reader.fields["general.type"].contents() == "adapter"
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["adapter.lora.alpha"].contents() == 32.0
    weights = {k: v.numpy() for k, v in (packed_adapter(adapter_dir("smollm2-writer")) or {}).items()}
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert len(tensors) == len(weights) == 420  # 30 blocks x 7 projections x 2 factors
    np.testing.assert_array_equal(
        tensors["blk.3.ffn_up.weight.lora_a"], weights[f"{LAYER}.mlp.up_proj.lora_A.weight"].astype(np.float16)
    )
    np.testing.assert_array_equal(
        tensors["blk.3.attn_output.weight.lora_b"],
        weights[f"{LAYER}.self_attn.o_proj.lora_B.weight"].astype(np.float16),
    )
    for proj, name, heads in (("q_proj", "attn_q", 9), ("k_proj", "attn_k", 3)):  # rows in the GGUF's rotary order
        b = weights[f"{LAYER}.self_attn.{proj}.lora_B.weight"]
        np.testing.assert_array_equal(
            tensors[f"blk.3.{name}.weight.lora_b"], llamacpp.rotary_rows(b, heads).astype(np.float16)
        )
        assert not np.array_equal(llamacpp.rotary_rows(b, heads), b)
    written = path.stat().st_mtime_ns
    assert llamacpp.adapter_gguf("smollm2-writer") == path and path.stat().st_mtime_ns == written  # written once


@pytest.mark.slow
def test_rotary_rows_reorder_query_and_key_rows_as_the_bundled_gguf_does():
    """The bundled GGUF's query and key weights are the de-quantised model's with rows in rotary order: the adapter's
    B factors must be reordered the same way to change the same weights."""
    model, _ = load_transformers("smollm2")
    gguf = {t.name: t for t in GGUFReader(str(bundled_gguf_path())).tensors}
    attention = model.model.layers[5].self_attn
    for proj, name, heads in ((attention.q_proj, "attn_q", 9), (attention.k_proj, "attn_k", 3)):
        tensor = gguf[f"blk.5.{name}.weight"]
        stored = dequantize(tensor.data, tensor.tensor_type).reshape(proj.weight.shape)
        weight = proj.weight.detach().numpy()
        np.testing.assert_allclose(llamacpp.rotary_rows(weight, heads), stored, atol=1e-6)
        assert not np.allclose(weight, stored, atol=1e-3)


@pytest.mark.slow
def test_llama_cpp_applies_the_writer_adapter_as_transformers_does(tmp_path, monkeypatch):
    pytest.importorskip("llama_cpp", reason="llama.cpp engine not installed (pip install 'dualmem[llamacpp]')")
    from langchain_core.messages import HumanMessage, SystemMessage

    from dualmem.config import Settings
    from dualmem.models import load_chat_model

    monkeypatch.setenv("DUALMEM_CACHE", str(tmp_path))
    messages = [
        SystemMessage("You are Mara, a nurse turned counsellor. Note what the user tells you."),
        HumanMessage(
            "I moved to night shifts at the warehouse, so I game until 3am to unwind. My sister Ana thinks I should quit."
        ),
    ]
    before = dict(os.environ)
    said = {}
    for name, engine in (("smollm2-writer", "llama.cpp"), ("smollm2-writer", "transformers"), ("smollm2", "llama.cpp")):
        model = load_chat_model(
            f"local:{name}", Settings(local_engine=engine, max_new_tokens=12)
        )  # the engines round differently: a long answer may drift
        assert model.engine == engine
        said[name, engine] = model.invoke(messages).content
        assert dict(os.environ) == before  # no engine sets a process-wide variable (children would inherit it)
    assert said["smollm2-writer", "llama.cpp"] == said["smollm2-writer", "transformers"]  # the same greedy start
    assert said["smollm2-writer", "llama.cpp"] != said["smollm2", "llama.cpp"]  # and not the base model's


def test_adapters_follow_the_engine_rule_of_the_base_model(monkeypatch):
    from dualmem.models.local import resolve_engine

    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object())
    assert resolve_engine("auto", "smollm2-writer") == resolve_engine("auto") == "llama.cpp"
    assert resolve_engine("transformers", "smollm2-writer") == "transformers"
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "llama_cpp" else object())
    assert resolve_engine("auto", "smollm2-writer") == "transformers"


def test_an_adapter_llama_cpp_cannot_apply_is_refused_in_one_line(tmp_path, monkeypatch):
    import json

    import torch
    from safetensors.torch import save_file

    from dualmem.errors import ConfigurationError

    monkeypatch.setenv("DUALMEM_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "patterned"
    folder.mkdir()
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "alpha_pattern": {"q_proj": 16}}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file(
        {f"{LAYER}.self_attn.q_proj.lora_A.weight": torch.zeros(4, 576)}, str(folder / "adapter_model.safetensors")
    )
    with pytest.raises(ConfigurationError, match="DUALMEM_LOCAL_ENGINE=transformers") as err:
        llamacpp.adapter_gguf(str(folder), HEADS)
    assert "\n" not in str(err.value)
    config.pop("alpha_pattern")
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file(
        {f"{LAYER}.self_attn.q_proj.lora_M.weight": torch.zeros(4, 576)}, str(folder / "adapter_model.safetensors")
    )
    with pytest.raises(ConfigurationError, match="cannot apply the adapter's .*lora_M"):
        llamacpp.adapter_gguf(str(folder), HEADS)
    assert not list((tmp_path / "cache" / "adapters").glob("*"))  # nothing half-written is left


@pytest.mark.slow
def test_the_llama_cpp_grammar_reads_the_vocabulary_the_tokenizer_has():
    pytest.importorskip("llama_cpp", reason="llama.cpp engine not installed (pip install 'dualmem[llamacpp]')")
    xgr = pytest.importorskip("xgrammar")
    from dualmem.models.local.bundled import stop_ids

    info = llamacpp.tokenizer_info("smollm2")  # read from llama.cpp in milliseconds; no tokenizer converted
    _, tok = load_transformers("smollm2")
    hf = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=info.vocab_size, stop_token_ids=stop_ids(tok))
    assert (info.vocab_type, info.vocab_size) == (hf.vocab_type, hf.vocab_size)
    assert info.decoded_vocab == hf.decoded_vocab
    assert llamacpp.llama("smollm2").token_eos() in info.stop_token_ids
    assert tok.convert_tokens_to_ids("<|im_end|>") in info.stop_token_ids


def test_the_heads_the_adapter_needs_are_read_from_the_gguf_by_llama_cpp():
    pytest.importorskip("llama_cpp", reason="llama.cpp engine not installed (pip install 'dualmem[llamacpp]')")
    fields = GGUFReader(str(bundled_gguf_path())).fields
    recorded = tuple(int(fields[f"llama.attention.{k}"].contents()) for k in ("head_count", "head_count_kv"))
    assert llamacpp.base_heads() == recorded == HEADS


def test_an_adapter_config_without_rank_or_alpha_reads_them_as_transformers_does(tmp_path, monkeypatch):
    import json

    import torch
    from safetensors.torch import save_file

    monkeypatch.setenv("DUALMEM_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "bare"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))  # no r, no lora_alpha
    save_file(
        {
            f"{LAYER}.self_attn.v_proj.lora_A.weight": torch.ones(4, 576),
            f"{LAYER}.self_attn.v_proj.lora_B.weight": torch.ones(192, 4),
        },
        str(folder / "adapter_model.safetensors"),
    )
    reader = GGUFReader(str(llamacpp.adapter_gguf(str(folder), HEADS)))
    assert reader.fields["adapter.lora.alpha"].contents() == 8.0  # peft's default, as merge_lora uses
    assert len(reader.tensors) == 2
