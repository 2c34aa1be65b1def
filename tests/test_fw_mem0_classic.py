"""mem0-classic: extraction then ADD / UPDATE / DELETE / NOOP against the most similar stored facts."""

from __future__ import annotations

import re

import pytest

from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.frameworks.mem0_classic import Mem0ClassicFramework, exchanges
from dualmem.schema import Session, Turn
from dualmem.testing import FakeChatModel, HashEmbeddings

# user message -> facts the fake extractor returns
FACTS = {
    "warehouse nights": ["User works night shifts at a warehouse"],
    "bakery now": ["User works day shifts at a bakery"],
    "still the bakery": ["User works day shifts at a bakery"],
    "cat Miso": ["User has a cat named Miso"],
    "Miso ran away": ["User no longer has a cat"],
}


def _shown(prompt: str) -> dict[str, str]:
    block = prompt.split("EXISTING MEMORIES (id: text):")[1].split("NEW FACT:")[0]
    return dict(re.findall(r"^(\d+): (.+)$", block, re.M))


def _id_of(prompt: str, needle: str) -> str:
    return next(i for i, text in _shown(prompt).items() if needle in text)


def _decide(prompt: str) -> dict:
    fact = prompt.split("NEW FACT:")[1].split("Choose")[0].strip()
    if fact == "User works day shifts at a bakery":
        if any(fact in text for text in _shown(prompt).values()):
            return {"event": "NOOP", "id": _id_of(prompt, fact)}
        return {
            "event": "UPDATE",
            "id": _id_of(prompt, "warehouse"),
            "text": "User works day shifts at a bakery, no longer nights at the warehouse",
        }
    if fact == "User no longer has a cat":
        return {"event": "DELETE", "id": _id_of(prompt, "cat named Miso")}
    return {"event": "ADD", "id": "0", "text": fact}


def script(messages, tool):
    prompt = str(messages[-1].content)
    if tool == "Mem0Facts":
        exchange = prompt.split("NEW EXCHANGE:")[1]
        return {"facts": [f for key, facts in FACTS.items() if key in exchange for f in facts]}
    if tool == "Mem0Decision":
        return _decide(prompt)
    return "summary: the user talks about work and pets"


def _session(sid: str, *user_texts: str) -> Session:
    turns = []
    for i, text in enumerate(user_texts):
        turns += [
            Turn(id=f"{sid}-u{i}", role="user", text=text),
            Turn(id=f"{sid}-a{i}", role="assistant", text="I see."),
        ]
    return Session(id=sid, time="2024-03-0" + sid[-1], turns=turns)


@pytest.fixture
def fw(tmp_settings):
    model = FakeChatModel(responses=[script], cycle=True)
    ctx = FrameworkContext(namespace=("p", "u"), settings=tmp_settings, chat_model=model, embeddings=HashEmbeddings())
    return Mem0ClassicFramework(ctx)


def _texts(fw) -> list[str]:
    return sorted(i.text for i in fw.store.list(fw.namespace, kind="fact"))


def test_contradicted_fact_is_updated_and_duplicate_is_noop(fw):
    r1 = fw.ingest(_session("s1", "I do warehouse nights, so tired", "My cat Miso keeps me company"))
    assert r1.meta["events"]["ADD"] == 2 and r1.failed_chunks == []
    assert _texts(fw) == ["User has a cat named Miso", "User works night shifts at a warehouse"]

    r2 = fw.ingest(_session("s2", "I quit, bakery now, mornings are great"))
    assert r2.meta["events"] == {"ADD": 0, "UPDATE": 1, "DELETE": 0, "NOOP": 0}
    assert _texts(fw) == [
        "User has a cat named Miso",
        "User works day shifts at a bakery, no longer nights at the warehouse",
    ]
    (job,) = [i for i in fw.retrieve("where does the user work", k=5) if "bakery" in i.text]
    assert job.meta["history"][0]["text"] == "User works night shifts at a warehouse"
    assert job.source_session == "s2" and job.source_sessions == ["s1", "s2"]

    before = _texts(fw)
    r3 = fw.ingest(_session("s3", "yes still the bakery, I told you"))
    assert r3.meta["events"]["NOOP"] == 1 and r3.items_written == 0
    assert _texts(fw) == before


def test_contradicted_fact_is_deleted(fw):
    fw.ingest(_session("s1", "My cat Miso keeps me company", "I do warehouse nights"))
    report = fw.ingest(_session("s2", "Miso ran away last week"))
    assert report.meta["events"]["DELETE"] == 1
    assert all("Miso" not in i.text for i in fw.retrieve("cat Miso", k=10))
    assert any("Miso" in i.text for i in fw.store.list(fw.namespace, kind="fact", status="superseded"))


def test_decision_shows_top_similar_facts_and_first_fact_needs_no_decision(fw):
    model = fw.context.chat_model
    fw.ingest(_session("s1", "I do warehouse nights"))
    assert [c for c in model.calls if "NEW FACT:" in str(c[-1].content)] == []
    fw.ingest(_session("s2", "bakery now"))
    decision = [c for c in model.calls if "NEW FACT:" in str(c[-1].content)]
    assert len(decision) == 1
    assert "User works night shifts at a warehouse" in _shown(str(decision[0][-1].content)).values()
    # extraction saw the summary and the recent messages of the earlier session
    extract = [c for c in model.calls if "NEW EXCHANGE:" in str(c[-1].content)][-1]
    assert "summary: the user talks" in str(extract[-1].content)
    assert "warehouse nights" in str(extract[-1].content).split("NEW EXCHANGE:")[0]


def test_unknown_id_is_repaired_by_retry(tmp_settings):
    answers = iter([{"event": "UPDATE", "id": "9", "text": "x"}])

    def wrong_then_right(messages, tool):
        if tool == "Mem0Decision":
            bad = next(answers, None)
            return bad if bad is not None else _decide(str(messages[1].content))
        return script(messages, tool)

    model = FakeChatModel(responses=[wrong_then_right], cycle=True)
    ctx = FrameworkContext(namespace=("p", "u"), settings=tmp_settings, chat_model=model, embeddings=HashEmbeddings())
    fw = Mem0ClassicFramework(ctx)
    fw.ingest(_session("s1", "I do warehouse nights"))
    report = fw.ingest(_session("s2", "bakery now"))
    assert report.meta["events"]["UPDATE"] == 1 and report.failed_chunks == []
    assert any("Input should be '0'" in str(m.content) for m in model.calls[-2])  # the validation error is fed back


def test_failed_extraction_is_recorded_and_retried(tmp_settings):
    model = FakeChatModel(responses=[RuntimeError("model down")], cycle=True)
    ctx = FrameworkContext(
        namespace=("p", "u"),
        settings=tmp_settings.replace(max_retries=1),
        chat_model=model,
        embeddings=HashEmbeddings(),
    )
    fw = Mem0ClassicFramework(ctx)
    session = _session("s1", "I do warehouse nights")
    report = fw.ingest(session)
    assert len(report.failed_chunks) == 1 and "model down" in report.meta["errors"][report.failed_chunks[0]]
    assert report.meta["summary_errors"]
    fw.context.chat_model = FakeChatModel(responses=[script], cycle=True)
    assert fw.ingest(session).meta["events"]["ADD"] == 1


def test_ingest_is_idempotent_across_restart(fw):
    session = _session("s1", "I do warehouse nights", "My cat Miso keeps me company")
    fw.ingest(session)
    calls = len(fw.context.chat_model.calls)
    again = open_framework("mem0-classic", fw.context)
    report = again.ingest(session)
    assert report.llm_calls == 0 and len(fw.context.chat_model.calls) == calls
    assert len(_texts(again)) == 2
    again.reset()
    assert again.retrieve("cat", k=5) == []


def test_exchanges_group_user_and_assistant_turns():
    s = Session(
        id="s",
        turns=[
            Turn(id="a0", role="assistant", text="hi"),
            Turn(id="u1", role="user", text="x"),
            Turn(id="a1", role="assistant", text="y"),
            Turn(id="a2", role="assistant", text="z"),
            Turn(id="u2", role="user", text="w"),
        ],
    )
    assert [[t.id for t in e] for e in exchanges(s)] == [["a0"], ["u1", "a1", "a2"], ["u2"]]


def test_summary_refresh_and_recent_context_are_token_bounded(tmp_settings):
    from dualmem.models.tokens import count_tokens

    def run(chunk_tokens: int) -> FakeChatModel:
        model = FakeChatModel(responses=[script], cycle=True)
        ctx = FrameworkContext(
            namespace=("p", str(chunk_tokens)),
            settings=tmp_settings.replace(chunk_tokens=chunk_tokens),
            chat_model=model,
            embeddings=HashEmbeddings(),
        )
        long = " ".join(["detail"] * 60)
        Mem0ClassicFramework(ctx).ingest(_session("s1", f"first {long}", f"second {long}", f"third {long}"))
        return model

    def summaries(model):
        return [c for c in model.calls if "running summary" in str(c[-1].content)]

    big = run(10_000)
    assert len(summaries(big)) == 1  # once, at the end of the session
    # generated within ~2 tokens a word of the summary budget, not the model's whole limit
    limits = [
        kw.get("max_tokens")
        for c, kw in zip(big.calls, big.call_kwargs, strict=True)
        if "running summary" in str(c[-1].content)
    ]
    assert limits == [2 * 150]
    small = run(40)
    assert len(summaries(small)) == 3  # every exchange reaches the token budget
    last = [c for c in small.calls if "NEW EXCHANGE:" in str(c[-1].content)][-1]
    recent = str(last[-1].content).split("Recent messages:")[1].split("Session date:")[0]
    assert 0 < count_tokens(recent) <= 40 + 5


def test_decision_schema_offers_only_the_shown_ids():
    from dualmem.frameworks.mem0_classic import decision_schema

    schema = decision_schema(["0", "1", "2"])
    assert schema.__name__ == "Mem0Decision"
    # grammar-constrained and strict structured output can only name a shown memory
    id_schema = schema.model_json_schema()["properties"]["id"]
    assert id_schema["enum"] == ["0", "1", "2"] and id_schema["type"] == "string"
    assert "id" in schema.model_json_schema()["required"]  # so no grammar lets an UPDATE name no memory
    assert schema(event="DELETE", id="2").id == "2"
    assert schema(event="ADD", id="0", text="User has a dog").event == "ADD"
    for bad in (
        {"event": "UPDATE", "id": "7", "text": "x"},
        {"event": "DELETE"},
        {"event": "ADD", "text": "no id"},
        {"event": "UPDATE", "id": "1", "text": " "},
    ):
        with pytest.raises(ValueError):
            schema(**bad)
