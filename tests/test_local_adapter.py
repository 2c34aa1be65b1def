"""The shipped writer adapter: merged without peft, identical to peft's merge, and the bundled model's default writer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from dualmem.config import Settings
from dualmem.errors import ConfigurationError
from dualmem.models.local.bundled import _load_base, adapter_dir, load_local, packed_adapter

pytestmark = pytest.mark.slow  # runs the bundled model (in the default suite)


@pytest.fixture(scope="module")
def prompt_ids():
    _, tok = _load_base("smollm2")
    return tok("User sails every weekend and hates crowded harbours. Facts:", return_tensors="pt").input_ids


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_merge_without_peft_equals_peft_merge(prompt_ids):
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    folder = adapter_dir("smollm2-writer")
    mine, _ = load_local("smollm2-writer")
    base, _ = _load_base("smollm2")
    config = LoraConfig.from_pretrained(str(folder))
    config.inference_mode = True
    lora = get_peft_model(base, config)
    set_peft_model_state_dict(lora, packed_adapter(folder))
    theirs = lora.merge_and_unload()
    ours, ref = _logits(mine, prompt_ids), _logits(theirs, prompt_ids)
    assert torch.allclose(ours, ref, atol=1e-4), (ours - ref).abs().max()
    base_only, _ = _load_base("smollm2")
    assert not torch.allclose(ours, _logits(base_only, prompt_ids), atol=1e-3)  # the adapter changed something


def test_loading_the_writer_does_not_import_peft():
    # peft made unimportable (it comes with the train extra only): the default writer must still load and merge
    code = (
        "import sys; sys.modules['peft'] = None; from dualmem.config import Settings; "
        "from dualmem.models.local.bundled import load_transformers; s = Settings(); "
        "model, _ = load_transformers(s.writer.split(':', 1)[1]); print(s.writer, type(model).__name__)"
    )
    drop = ("DUALMEM_WRITER_MODEL", "DUALMEM_CHAT_MODEL", "DUALMEM_LOCAL_ENGINE")
    env = {k: v for k, v in os.environ.items() if k not in drop} | {"HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    spec, kind = out.stdout.split()
    assert spec == "local:smollm2-writer" and kind == "LlamaForCausalLM"


def _plain_copy(tmp_path, drop: str | None = None, **config):
    from safetensors.torch import save_file

    folder = tmp_path / "adapter"
    folder.mkdir()
    source = adapter_dir("smollm2-writer")
    weights = {k: v.contiguous() for k, v in packed_adapter(source).items() if k != drop}
    save_file(weights, str(folder / "adapter_model.safetensors"))
    cfg = json.loads((source / "adapter_config.json").read_text()) | config
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def test_a_plain_peft_folder_merges_like_the_packed_one(tmp_path, prompt_ids):
    folder = _plain_copy(tmp_path)
    plain, _ = load_local(str(folder))
    packed, _ = load_local("smollm2-writer")
    assert torch.allclose(_logits(plain, prompt_ids), _logits(packed, prompt_ids), atol=1e-5)


def test_alpha_pattern_and_rslora_merge_as_peft_merges(tmp_path, prompt_ids):
    from peft import PeftModel

    folder = _plain_copy(
        tmp_path, alpha_pattern={"q_proj|v_proj": 8, "^model.layers.1.mlp.down_proj": 64}, use_rslora=True
    )
    mine, _ = load_local(str(folder))
    base, _ = _load_base("smollm2")
    theirs = PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
    ours, ref = _logits(mine, prompt_ids), _logits(theirs, prompt_ids)
    assert torch.allclose(ours, ref, atol=1e-4), (ours - ref).abs().max()


def test_an_adapter_beyond_plain_lora_goes_through_peft(tmp_path):
    from dualmem.models.local.bundled import plain_lora

    plain = _plain_copy(tmp_path)
    assert plain_lora(plain, None)
    for extra in ({"use_dora": True}, {"init_lora_weights": "pissa"}, {"modules_to_save": ["lm_head"]}):
        (tmp_path / "x").mkdir()
        assert not plain_lora(_plain_copy(tmp_path / "x", **extra), None), extra
        shutil.rmtree(tmp_path / "x")


def test_rslora_scales_by_the_square_root_of_the_rank(tmp_path, prompt_ids):
    base, _ = _load_base("smollm2")
    plain, _ = load_local(str(_plain_copy(tmp_path)))
    (tmp_path / "rs").mkdir()
    rs, _ = load_local(str(_plain_copy(tmp_path / "rs", use_rslora=True)))
    layer = "model.layers.0.self_attn.q_proj"
    delta = plain.get_submodule(layer).weight - base.get_submodule(layer).weight
    delta_rs = rs.get_submodule(layer).weight - base.get_submodule(layer).weight
    assert torch.allclose(delta_rs, delta * 4.0, atol=1e-5)  # r = 16: alpha/sqrt(r) = 4 × alpha/r


def test_an_adapter_that_does_not_fit_is_a_one_line_error(tmp_path):
    folder = _plain_copy(tmp_path, drop="base_model.model.model.layers.3.mlp.up_proj.lora_B.weight")
    with pytest.raises(ConfigurationError, match=r"without their pair") as err:
        load_local(str(folder))
    assert "\n" not in str(err.value)
    other = tmp_path / "other"
    other.mkdir()
    bad = _plain_copy(other)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(bad / "adapter_model.safetensors"))
    weights["base_model.model.model.layers.99.mlp.up_proj.lora_A.weight"] = torch.zeros(16, 576)
    weights["base_model.model.model.layers.99.mlp.up_proj.lora_B.weight"] = torch.zeros(1536, 16)
    save_file(weights, str(bad / "adapter_model.safetensors"))
    with pytest.raises(ConfigurationError, match=r"does not fit the base model \(.*layers\.99"):
        load_local(str(bad))
    shutil.rmtree(bad)


def test_the_bundled_model_writes_with_its_adapter_unless_told_otherwise(monkeypatch):
    for var in ("DUALMEM_WRITER_MODEL", "DUALMEM_CHAT_MODEL", "DUALMEM_LOCAL_ENGINE"):
        monkeypatch.delenv(var, raising=False)
    assert Settings().writer == "local:smollm2-writer"
    assert Settings().chat_model == "local:smollm2"  # the adapter writes; the base model still answers
    assert Settings(writer_model="local:smollm2").writer == "local:smollm2"
    assert Settings(chat_model="openai:gpt-4o-mini").writer == "openai:gpt-4o-mini"
    assert Settings(local_engine="llama.cpp").writer == "local:smollm2-writer"  # llama.cpp applies the LoRA too
    assert Settings(local_engine="transformers").writer == "local:smollm2-writer"
    monkeypatch.setenv("DUALMEM_WRITER_MODEL", "local:smollm2")
    assert Settings().writer == "local:smollm2"
