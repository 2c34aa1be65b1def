"""dualmem.testing's fake chat model binds tools as chat models do and fills any schema from the dialogue."""

from __future__ import annotations

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableBinding
from pydantic import BaseModel, Field

from dualmem.testing import FakeChatModel, make_fake


class Facts(BaseModel):
    """Facts."""

    facts: list[str] = Field(default_factory=list)


class Mood(BaseModel):
    """A mood."""

    mood: str


CHUNK = '[s1-t1] user: "I moved to night shifts at the warehouse last month"\n[s1-t2] assistant: "How is it going?"'


def test_bind_tools_is_a_binding_and_tool_choice_picks_the_tool():
    model = FakeChatModel(responses=[{"mood": "tired"}])
    bound = model.bind_tools([Facts, Mood], tool_choice="Mood")
    assert isinstance(bound, RunnableBinding) and bound.bound is model
    message = bound.invoke([HumanMessage(content="hi")])
    assert message.tool_calls[0]["name"] == "Mood" and message.tool_calls[0]["args"] == {"mood": "tired"}
    first = model.bind_tools([Facts, Mood]).invoke([HumanMessage(content="hi")])
    assert first.tool_calls[0]["name"] == "Facts"


def test_fake_memory_fills_every_field_with_a_line_of_the_dialogue():
    model = make_fake("memory")
    facts = model.with_structured_output(Facts).invoke([HumanMessage(content=CHUNK)])
    assert facts.facts == ["I moved to night shifts at the warehouse last month"]
    reply = model.invoke([HumanMessage(content=CHUNK)]).content
    assert "night shifts at the warehouse" in reply and reply.startswith("(fake reply)")
