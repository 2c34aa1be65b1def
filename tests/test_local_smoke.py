"""Smoke run of the writer and the responder on the bundled SmolLM2 (checks the pipeline, not quality)."""

from __future__ import annotations

import pytest

from dualmem.config import Settings
from dualmem.schema import Dialogue, MemoryUpdate, Persona, Session, Turn

pytestmark = pytest.mark.slow

PERSONA = Persona(id="mia", name="Dr. Mia Laurent", description="sleep psychologist", core_values=["rest is not laziness"])
SESSION = Session(
    id="s1",
    time="2025-01-03",
    turns=[
        Turn(id="s1:t1", role="user", text="Long week. I moved to night shifts at the warehouse, so I game until 3am to unwind."),
        Turn(id="s1:t2", role="assistant", text="That sounds like a big change. How are you sleeping?"),
    ],
)


@pytest.fixture(scope="module")
def local_model():
    try:
        from dualmem.models import load_chat_model

        return load_chat_model("local:smollm2", Settings(max_new_tokens=200))
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"bundled model unavailable: {exc}")


def test_local_model_answers_in_schema(local_model):
    from langchain_core.messages import HumanMessage

    from dualmem.structured import invoke_structured

    out = invoke_structured(local_model, [HumanMessage("List the facts: I work night shifts.")], MemoryUpdate, retries=0)
    assert out.ok, f"grammar-constrained decoding must give valid JSON: {out.error}"


def test_writer_and_responder_run_on_the_bundled_model(local_model, tmp_path):
    from dualmem.graphs.respond import respond
    from dualmem.graphs.write import write_history

    settings = Settings(
        store_uri=str(tmp_path / "db"), checkpoint_path=str(tmp_path / "ck.sqlite"), embedder="hash:64", max_new_tokens=200
    )
    report = write_history(Dialogue(id="d", persona=PERSONA, sessions=[SESSION]), PERSONA, settings=settings, model=local_model, progress=False)
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

    message = local_model.bind_tools([Memory]).invoke("Remember that I work night shifts.")
    assert message.tool_calls and message.tool_calls[0]["name"] == "Memory"
    assert isinstance(message.tool_calls[0]["args"].get("content"), str)
