"""The writer (write_history and the write graph) on both stores — a real LanceDB folder and the in-memory store —
with a scripted structured-output model."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from dualmem.context import context_of
from dualmem.graphs.write import builder
from dualmem.memory.chunking import chunk_sessions
from dualmem.schema import Persona, Session, Turn
from dualmem.stores import InMemoryDualStore, LanceDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings
from dualmem.writer import awrite_history, write_history

PERSONA = Persona(id="dr-lee", name="Dr. Lee", description="a clinical psychologist")
NS = ("dr-lee", "user")


def _sessions(n_sessions: int, turns: int = 2) -> list[Session]:
    out = []
    for s in range(n_sessions):
        out.append(
            Session(
                id=f"s{s}",
                time=f"2024-01-{s + 1:02d}",
                turns=[
                    Turn(
                        id=f"s{s}t{i}",
                        role="user" if i % 2 == 0 else "assistant",
                        text=f"topic{s} detail{s}x{i} happened today",
                    )
                    for i in range(turns)
                ],
            )
        )
    return out


def _chunk_of(messages) -> str:
    """Return the first user turn id of the chunk in the writer's prompt."""
    return re.search(r"\[(s\d+t\d+)\] User:", str(messages[1].content)).group(1)


def _one_fact_each(messages, tool=None):
    turn = _chunk_of(messages)
    return {
        "facts": [{"op": "ADD", "id": "N1", "text": f"the user mentioned {turn} zz{turn}", "turn_ids": [turn]}],
        "insights": [{"op": "ADD", "id": "M1", "text": f"I sense {turn} matters qq{turn}", "fact_ids": ["N1"]}],
    }


@pytest.fixture(params=["lancedb", "memory"])
def store(request, tmp_path):
    if request.param == "memory":
        return InMemoryDualStore(HashEmbeddings(64))
    return LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))


def _run(tmp_settings, model, store, sessions, **kw):
    return write_history(
        sessions,
        PERSONA,
        settings=tmp_settings.replace(chunk_tokens=kw.pop("chunk_tokens", 40)),
        model=model,
        store=store,
        progress=False,
        **kw,
    )


def test_write_adds_grounded_facts_and_insights(tmp_settings, store):
    model = FakeChatModel(responses=[_one_fact_each], cycle=True)
    report = _run(tmp_settings, model, store, _sessions(3))
    assert [r["status"] for r in report.chunks] == ["applied"] * 3
    assert report.facts_written == 3 and report.insights_written == 3 and not report.failed_chunks
    facts = store.list(NS, kind="fact")
    insights = store.list(NS, kind="insight")
    assert len(facts) == 3 and len(insights) == 3
    fact_ids = {f.id for f in facts}
    for ins in insights:
        assert ins.grounding and set(ins.grounding) <= fact_ids
    assert {f.source.session_id for f in facts} == {"s0", "s1", "s2"}
    assert all(row["prompt_tokens"] > 0 and row["turn_ids"] for row in report.chunks)


def _update_then_delete(messages, tool=None):
    prompt = str(messages[-1].content)
    turn = _chunk_of(messages)
    if not re.search(r"^F1\b", prompt, re.M):
        return {
            "facts": [{"op": "ADD", "id": "N1", "text": "works night shifts at a warehouse", "turn_ids": [turn]}],
            "insights": [{"op": "ADD", "id": "M1", "text": "exhaustion, not laziness", "fact_ids": ["N1"]}],
        }
    if "day shifts" not in prompt:
        return {
            "facts": [{"op": "UPDATE", "id": "F1", "text": "moved to day shifts at the warehouse", "turn_ids": [turn]}]
        }
    return {"insights": [{"op": "DELETE", "id": "I1"}]}


def test_update_in_place_and_delete_keep_history(tmp_settings, store):
    model = FakeChatModel(responses=[_update_then_delete], cycle=True)
    report = _run(tmp_settings, model, store, _sessions(3))
    assert [r["status"] for r in report.chunks] == ["applied"] * 3
    (fact,) = store.list(NS, kind="fact")
    assert fact.text == "moved to day shifts at the warehouse"
    assert fact.source.turn_ids == ["s0t0", "s1t0"]
    assert store.list(NS, kind="insight") == []  # deleted = superseded, hidden
    old = [i for i in store.list(NS, status=None) if i.status == "superseded"]
    assert {i.text for i in old} == {"works night shifts at a warehouse", "exhaustion, not laziness"}
    assert [op["op"] for row in report.chunks for op in row["applied"]] == ["ADD", "ADD", "UPDATE", "DELETE"]


def test_rejected_ops_are_reported(tmp_settings, store):
    bad = {"facts": [], "insights": [{"op": "ADD", "id": "M1", "text": "an ungrounded hunch", "fact_ids": ["F42"]}]}
    report = _run(tmp_settings, FakeChatModel(responses=[bad]), store, _sessions(1))
    (row,) = report.chunks
    assert row["status"] == "applied" and row["applied"] == []
    assert "F42" in row["rejected"][0]["reason"] and report.rejected == 1
    assert store.count(NS) == 0


def test_malformed_answer_is_repaired(tmp_settings, store):
    good = _one_fact_each
    model = FakeChatModel(responses=["this is not json", good, good])
    report = _run(tmp_settings, model, store, _sessions(1))
    (row,) = report.chunks
    assert row["status"] == "applied" and row["attempts"] == 2
    assert "could not be used" in str(model.calls[1][-1].content)  # the error was fed back
    assert store.count(NS, kind="fact") == 1


def test_failed_chunk_is_reported_then_retried(tmp_settings, store):
    broken = FakeChatModel(
        responses=[lambda m: "never json" if "s1t0" in str(m[1].content) else _one_fact_each(m)], cycle=True
    )
    settings = tmp_settings.replace(chunk_tokens=40, max_retries=1)
    sessions = _sessions(3)
    report = write_history(sessions, PERSONA, settings=settings, model=broken, store=store, progress=False)
    assert [r["status"] for r in report.chunks] == ["applied", "failed", "applied"]
    (failed,) = report.failed_chunks
    assert failed["chunk_id"] == report.chunks[1]["chunk_id"] and failed["error"] and failed["attempts"] == 2
    assert not store.chunk_applied(NS, failed["chunk_id"])
    assert store.count(NS, kind="fact") == 2

    fixed = FakeChatModel(responses=[_one_fact_each], cycle=True)
    again = write_history(
        sessions, PERSONA, settings=settings, model=fixed, store=store, progress=False
    )  # the same call again
    assert len(fixed.calls) == 1  # only the failed chunk was redone
    assert [r["status"] for r in again.chunks] == ["skipped", "applied", "skipped"] and again.failed_chunks == []
    assert store.count(NS, kind="fact") == 3


def test_the_graph_run_again_on_its_input_redoes_only_failed_chunks(tmp_settings, store):
    graph = builder.compile()
    inputs = {"persona": PERSONA.model_dump(mode="json"), "sessions": [s.model_dump(mode="json") for s in _sessions(3)]}
    flaky = FakeChatModel(
        responses=[lambda m: "never json" if "s1t0" in str(m[1].content) else _one_fact_each(m)], cycle=True
    )
    settings = tmp_settings.replace(chunk_tokens=40, max_retries=0)
    out = graph.invoke(inputs, context=context_of(settings, models={"writer": flaky}, store=store))
    (failed,) = out["failed_chunks"]
    assert failed["index"] == 1 and failed["error"] and out["sessions"] == []
    fixed = FakeChatModel(responses=[_one_fact_each], cycle=True)
    again = graph.invoke(inputs, context=context_of(settings, models={"writer": fixed}, store=store))
    assert len(fixed.calls) == 1 and again["failed_chunks"] == []
    assert [r["status"] for r in again["report"]] == ["skipped", "applied", "skipped"]
    assert store.count(NS, kind="fact") == 3


class _CrashOnce:
    """Raise once when ``trigger`` is true, then behave."""

    def __init__(self, trigger, error=RuntimeError):
        self.trigger, self.fired, self.error = trigger, False, error

    def check(self, *args):
        if not self.fired and self.trigger(*args):
            self.fired = True
            raise self.error("simulated crash")


def test_resume_after_a_crash_in_the_model_step(tmp_settings, store):
    # the process is interrupted while the model answers (a model *error* is a failed chunk instead: test_hostile_*)
    crash = _CrashOnce(lambda m: "s2t0" in str(m[1].content), error=KeyboardInterrupt)

    def answer(messages, tool=None):
        crash.check(messages)
        return _one_fact_each(messages)

    model = FakeChatModel(responses=[answer], cycle=True)
    sessions = _sessions(5)
    with pytest.raises(KeyboardInterrupt, match="simulated crash"):
        _run(tmp_settings, model, store, sessions)
    assert store.count(NS, kind="fact") == 2
    report = _run(tmp_settings, model, store, sessions)
    assert len(model.calls) == 5 + 1  # each chunk once, plus the call that crashed
    assert [r["status"] for r in report.chunks] == ["skipped"] * 2 + ["applied"] * 3  # 2 applied by the killed run
    assert store.count(NS, kind="fact") == 5 and store.count(NS, kind="insight") == 5
    assert all(store.chunk_applied(NS, r["chunk_id"]) for r in report.chunks)


class _FlakyStore(LanceDualStore):
    """A real store whose ledger commits marking a chosen chunk applied fail (after its rows were written) until
    ``broken`` is cleared: the process as if it died there."""

    crash: Callable[[str], bool]
    broken = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        mark_all = self.ledger.mark_all

        def flaky(namespace, marks):
            if self.broken and any(state == "applied" and self.crash(unit) for unit, state, _ in marks):
                raise RuntimeError("simulated crash")
            mark_all(namespace, marks)

        self.ledger.mark_all = flaky


def test_resume_after_a_crash_in_the_apply_step(tmp_settings, tmp_path):
    store = _FlakyStore(str(tmp_path / "db"), HashEmbeddings(64))
    sessions = _sessions(4)
    third = chunk_sessions(sessions, NS, 40)[2]["id"]
    store.crash = lambda unit: unit == third
    model = FakeChatModel(responses=[_one_fact_each], cycle=True)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(tmp_settings, model, store, sessions)
    store.broken = False
    # chunk 3's rows were written; the commit marking it applied (with chunk 4's plan) failed
    assert len(model.calls) == 4
    assert store.count(NS, kind="fact") == 3
    report = _run(tmp_settings, model, store, sessions)
    assert len(model.calls) == 5  # chunk 3's plan was replayed, not re-asked; chunk 4's was never recorded
    assert [r["status"] for r in report.chunks] == ["skipped"] * 2 + ["applied"] * 2
    assert report.chunks[2].get("recovered") is True
    assert store.count(NS, kind="fact") == 4 and store.count(NS, kind="insight") == 4
    assert store.count(NS, status=None) == 8  # no duplicates, no orphans


def test_rerun_of_a_finished_history_asks_nothing(tmp_settings, store):
    model = FakeChatModel(responses=[_one_fact_each], cycle=True)
    _run(tmp_settings, model, store, _sessions(2))
    report = _run(tmp_settings, model, store, _sessions(3))  # one new session
    assert len(model.calls) == 3
    assert [r["status"] for r in report.chunks] == ["skipped", "skipped", "applied"]
    assert store.count(NS, kind="fact") == 3


def test_namespaces_are_isolated(tmp_settings, store):
    model = FakeChatModel(responses=[_one_fact_each], cycle=True)
    other = Persona(id="coach", name="Coach Kim")
    _run(tmp_settings, model, store, _sessions(2))
    report = write_history(
        _sessions(2), other, settings=tmp_settings.replace(chunk_tokens=40), model=model, store=store, progress=False
    )
    assert [r["status"] for r in report.chunks] == ["applied", "applied"]  # same turn ids, own ledger
    assert store.count(NS) == 4 and store.count(("coach", "user")) == 4
    assert {i.namespace for i in store.list(("coach", "user"))} == {("coach", "user")}
    assert "Coach Kim" in str(model.calls[-1][0].content)


def test_prompt_tokens_stay_flat_as_memory_grows(tmp_settings, store):
    def two_facts(messages, tool=None):
        turn = _chunk_of(messages)
        return {
            "facts": [
                {
                    "op": "ADD",
                    "id": "N1",
                    "text": f"fact one about {turn} with several words a{turn}",
                    "turn_ids": [turn],
                },
                {
                    "op": "ADD",
                    "id": "N2",
                    "text": f"fact two about {turn} with other words b{turn}",
                    "turn_ids": [turn],
                },
            ],
            "insights": [{"op": "ADD", "id": "M1", "text": f"insight on {turn} c{turn}", "fact_ids": ["N1", "N2"]}],
        }

    settings = tmp_settings.replace(chunk_tokens=40, view_k=3, view_recent=2)
    model = FakeChatModel(responses=[two_facts], cycle=True)
    report = write_history(_sessions(24), PERSONA, settings=settings, model=model, store=store, progress=False)
    tokens = report.prompt_tokens
    assert len(tokens) == 24 and store.count(NS, kind="fact") == 48
    early, late = tokens[6:12], tokens[-6:]
    assert max(late) <= max(early) * 1.1  # memory grew 4x, the prompt did not
    view = str(model.calls[-1][-1].content).split("## CONVERSATION CHUNK")[0]
    assert len(re.findall(r"^F\d+", view, re.M)) <= 5 and len(re.findall(r"^I\d+", view, re.M)) <= 5


def test_graph_runs_with_a_context_carrying_model_and_store(tmp_settings, store):
    model = FakeChatModel(responses=[_one_fact_each], cycle=True)
    graph = builder.compile()  # no runtime.store: the context's store serves
    context = context_of(tmp_settings.replace(chunk_tokens=40), models={"writer": model}, store=store)
    inputs = {"persona": PERSONA.model_dump(mode="json"), "sessions": [s.model_dump(mode="json") for s in _sessions(2)]}
    out = graph.invoke(inputs, context=context)
    assert [r["status"] for r in out["report"]] == ["applied", "applied"]
    assert out["namespace"] == list(NS)
    assert out["failed_chunks"] == []
    assert len(model.calls) == 2 and store.count(NS, kind="fact") == 2


async def test_async_write_history(tmp_settings, store):
    model = FakeChatModel(responses=[_one_fact_each], cycle=True)
    report = await awrite_history(
        _sessions(2), PERSONA, settings=tmp_settings.replace(chunk_tokens=40), model=model, store=store, progress=False
    )
    assert [r["status"] for r in report.chunks] == ["applied", "applied"]
    assert store.count(NS, kind="insight") == 2


def test_exported_graph_with_a_settings_dict_context(tmp_settings):
    from dualmem.errors import ConfigurationError
    from dualmem.graphs.write import graph
    from dualmem.stores import LanceDBStore

    context = {
        "chat_model": "fake:memory",
        "options": {"store_uri": tmp_settings.store_uri, "embedder": "hash:64", "chunk_tokens": 40},
    }
    inputs = {"persona": PERSONA.model_dump(mode="json"), "sessions": [s.model_dump(mode="json") for s in _sessions(2)]}
    with pytest.raises(ConfigurationError, match="no memory store"):  # the graph never opens a store of its own
        graph.invoke(inputs, context=context)
    served = builder.compile(
        store=LanceDBStore(tmp_settings.store_uri, index={"dims": 64, "embed": HashEmbeddings(64)})
    )
    out = served.invoke(inputs, context=context)  # as `langgraph dev` runs it: the server's store is runtime.store
    assert [r["status"] for r in out["report"]] == ["applied", "applied"]
    store = LanceDualStore(tmp_settings.store_uri, HashEmbeddings(64))
    added = [op for r in out["report"] for op in r["applied"] if op["op"] == "ADD"]
    assert added and store.count(NS) == len(added)  # the fake writer's facts (near-duplicates merged)
    assert all(store.chunk_applied(NS, r["chunk_id"]) for r in out["report"])


def test_a_crashed_thread_given_a_longer_history_finishes_both(tmp_settings, store):
    crash = _CrashOnce(lambda m: "s1t0" in str(m[1].content), error=KeyboardInterrupt)

    def answer(messages, tool=None):
        crash.check(messages)
        return _one_fact_each(messages)

    model = FakeChatModel(responses=[answer], cycle=True)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_settings, model, store, _sessions(2))
    report = _run(tmp_settings, model, store, _sessions(4))
    assert [r["status"] for r in report.chunks] == ["skipped"] + ["applied"] * 3
    assert store.count(NS, kind="fact") == 4 and len(model.calls) == 5
