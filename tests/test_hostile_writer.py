"""Writer answers: unknown keys are not an empty update; at most max_ops_per_chunk operations per chunk."""

from __future__ import annotations

import pytest

from dualmem.schema import MemoryUpdate, Persona, Session, Turn
from dualmem.stores import LanceDualStore
from dualmem.testing import FakeChatModel, HashEmbeddings
from dualmem.writer import write_history

PERSONA = Persona(id="dr-lee", name="Dr. Lee")
NS = ("dr-lee", "user")
SESSION = Session(
    id="s1", time="2024-01-01", turns=[Turn(id="t1", role="user", text="I moved to night shifts at the warehouse")]
)
GOOD = {"facts": [{"op": "ADD", "id": "N1", "text": "moved to night shifts", "turn_ids": ["t1"]}], "insights": []}


@pytest.fixture
def store(tmp_path):
    return LanceDualStore(str(tmp_path / "db"), HashEmbeddings(64))


@pytest.mark.parametrize(
    "answer",
    [
        {"memories": [{"text": "moved to night shifts"}]},
        {"facts": [{"op": "ADD", "id": "N1", "fact": "moved to night shifts"}], "insights": []},
    ],
)
def test_unknown_keys_are_repaired_not_taken_for_an_empty_update(tmp_settings, store, answer):
    model = FakeChatModel(responses=[answer, GOOD])
    report = write_history([SESSION], PERSONA, settings=tmp_settings, model=model, store=store, progress=False)
    (row,) = report.chunks
    assert row["status"] == "applied" and row["attempts"] == 2
    assert "Extra inputs are not permitted" in str(model.calls[1][-1].content)  # the error was fed back
    assert store.count(NS, kind="fact") == 1


def test_unknown_keys_that_are_never_repaired_fail_the_chunk_and_it_is_retried_later(tmp_settings, store):
    settings = tmp_settings.replace(max_retries=1)
    bad = FakeChatModel(responses=[{"memories": ["moved to night shifts"]}], cycle=True)
    report = write_history([SESSION], PERSONA, settings=settings, model=bad, store=store, progress=False, thread_id="t")
    (row,) = report.chunks
    assert row["status"] == "failed" and "memories" in row["error"] and report.failed_chunks
    assert not store.chunk_applied(NS, row["chunk_id"])  # not marked applied: the next run asks again
    again = write_history(
        [SESSION],
        PERSONA,
        settings=settings,
        model=FakeChatModel(responses=[GOOD]),
        store=store,
        progress=False,
        thread_id="t",
    )
    assert [r["status"] for r in again.chunks] == ["applied"]


def test_operations_beyond_the_cap_are_rejected_with_a_reason(tmp_settings, store):
    flood = {
        "facts": [
            {"op": "ADD", "id": f"N{i}", "text": f"fact number {i} zz{i}", "turn_ids": ["t1"]} for i in range(1, 1000)
        ],
        "insights": [{"op": "ADD", "id": "M1", "text": "an insight", "fact_ids": ["N1"]}],
    }
    assert len(MemoryUpdate.model_validate(flood).facts) == 999
    report = write_history(
        [SESSION],
        PERSONA,
        settings=tmp_settings.replace(max_ops_per_chunk=25),
        model=FakeChatModel(responses=[flood]),
        store=store,
        progress=False,
    )
    (row,) = report.chunks
    assert len(row["applied"]) == 25 and len(row["rejected"]) == 975
    assert all(
        "over the cap of 25 operations per chunk (setting max_ops_per_chunk)" == r["reason"] for r in row["rejected"]
    )
    assert store.count(NS, kind="fact") == 25 and store.count(NS, kind="insight") == 0
