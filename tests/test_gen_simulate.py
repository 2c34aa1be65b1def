"""The simulate graph: RealMem output that loads, a time firewall, memory queries, scheduling, dedup."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import ClassVar

from fixtures.gen_fakes import MARKERS, PROJECTS, SimScript, sim_model

from dualmem.config import Settings
from dualmem.datasets import load_dataset
from dualmem.frameworks.base import IngestReport, MemoryFramework, RetrievedItem
from dualmem.generate import generate_realmem
from dualmem.generators.simulate import dedupe, schedule
from dualmem.schema import Session
from dualmem.testing import HashEmbeddings

PERSONA = Path(__file__).resolve().parent / "fixtures" / "personas" / "mara.json"


class ListMemory(MemoryFramework):
    """A tiny in-memory framework: retrieves the latest user turns of earlier sessions."""

    name: ClassVar[str] = "list"
    description: ClassVar[str] = "test memory"

    def __init__(self) -> None:
        self.sessions: list[Session] = []

    def ingest(self, session: Session) -> IngestReport:
        self.sessions.append(session)
        return IngestReport(session_id=session.id, items_written=len(session.turns))

    def retrieve(self, query: str, k: int = 10, *, context=None) -> list[RetrievedItem]:
        items = [
            RetrievedItem(text=t.text, kind="turn", score=1.0, source_session=s.id)
            for s in self.sessions
            for t in s.turns
            if t.role == "user"
        ]
        return items[::-1][:k]


def settings_for(tmp_path: Path) -> Settings:
    return Settings(
        checkpoint_path=str(tmp_path / "ckpt.sqlite"),
        store_uri=str(tmp_path / "lancedb"),
        embedder="hash:64",
        max_retries=1,
    )


def simulate(tmp_path, model, framework, sessions=5, thread="s1"):
    return generate_realmem(
        PERSONA,
        tmp_path / "out",
        sessions=sessions,
        model=model,
        settings=settings_for(tmp_path),
        thread_id=thread,
        framework=framework,
        embeddings=HashEmbeddings(64),
        options={"max_turns": 3, "cooldown": 1},
    )


def seen_markers(session) -> set[str]:
    return {m for m in MARKERS for t in session.turns if t.role == "user" and m in t.text}


def test_simulation_round_trips_as_realmem_and_respects_time_firewall(tmp_path):
    memory = ListMemory()
    path = simulate(tmp_path, sim_model(), memory)
    assert path.name == "mara_dialogues_sim.json"
    item = load_dataset("realmem", path).items[0]
    sessions = item.dialogue.sessions
    assert len(sessions) == 5 and [s.id for s in memory.sessions] == [s.id for s in sessions]
    schedule_ = json.loads(path.read_text())["_metadata"]["schedule"]
    current = [next(m for m in MARKERS if m in row["event"]) for row in schedule_]
    assert len(set(current)) == 5
    for i, s in enumerate(sessions):
        # the user agent sees every past event and the current one ...
        assert seen_markers(s) == set(current[: i + 1])
        # ... and never a later one
        assert not seen_markers(s) & set(current[i + 1 :])
    # dates advance 1-3 days
    days = [datetime.fromisoformat(s.time[:10]) for s in sessions]  # RealMem: "2024-03-02 (Saturday)"
    assert all(1 <= (b.date() - a.date()).days <= 3 for a, b in zip(days, days[1:], strict=False))
    # memory use marks queries with the memory and the sessions it came from
    assert item.queries and all(q.session_id != sessions[0].id for q in item.queries)
    for q in item.queries:
        assert q.gold.memory_points and set(q.gold.session_ids) < {s.id for s in sessions}
        assert all(sid != q.session_id for sid in q.gold.session_ids)
    # memory points: typed, with source turn; the repeated static point is kept once
    points = [p for s in sessions for p in s.memory_points]
    assert {p.type for p in points} <= {"Static", "Dynamic", "Schedule"}
    assert sum("Pixel" in p.content for p in points) == 1
    assert all(p.source_turn is not None for p in points)


def test_firewall_blocks_a_user_agent_that_names_a_later_event(tmp_path):
    titles = [p["title"] for p in PROJECTS]
    planned = schedule(
        PROJECTS, [{"project": titles[i % 3], "title": f"Step {i} {MARKERS[i]}"} for i in range(5)], 5, cooldown=1
    )
    planted = next(m for m in MARKERS if m in planned[2]["title"])  # the event of the third session
    path = simulate(tmp_path, sim_model(SimScript(cheat_with=planted)), ListMemory(), sessions=5, thread="cheat")
    raw = json.loads(path.read_text())
    assert planted in raw["_metadata"]["schedule"][2]["event"]
    issues = raw["_metadata"]["issues"]
    # sessions 1-2 would have leaked the third session's event: blocked, retried, recorded, dropped
    assert sum(i["stage"] == "user" and "time firewall" in i["reason"] for i in issues) == 2
    assert sum("dropped" in i["reason"] for i in issues) == 2
    kept = raw["dialogues"]
    assert [s["session_uuid"] for s in kept] == [row["session_uuid"] for row in raw["_metadata"]["schedule"][2:]]
    assert all(any(planted in t["content"] for t in s["dialogue_turns"] if t["speaker"] == "User") for s in kept)


def test_simulation_with_registered_raw_turns_framework(tmp_path):
    path = simulate(tmp_path, sim_model(), "raw-turns", sessions=3, thread="raw")
    item = load_dataset("realmem", path).items[0]
    assert len(item.dialogue.sessions) == 3
    assert item.queries and all(q.gold.session_ids for q in item.queries)


def test_resume_finishes_without_redoing_sessions(tmp_path):
    calls = {"n": 0}
    script = SimScript()

    def dying(messages, tool):
        calls["n"] += 1
        if tool == "ExtractedMemory" and calls["n"] > 25:
            raise KeyboardInterrupt("killed")  # the process is stopped (a model error would be recorded instead)
        return script(messages, tool)

    from dualmem.testing import FakeChatModel

    memory = ListMemory()
    first = FakeChatModel(responses=[dying], cycle=True)
    try:
        simulate(tmp_path, first, memory, sessions=4, thread="resume")
    except KeyboardInterrupt:
        pass
    done = len(memory.sessions)
    assert 0 < done < 4
    second = sim_model()
    path = simulate(tmp_path, second, memory, sessions=4, thread="resume")
    assert len(memory.sessions) == 4  # earlier sessions were not simulated again
    assert not [m for m in second.calls if "Plan the next months" in str(m[-1].content)]
    assert len(load_dataset("realmem", path).items[0].dialogue.sessions) == 4


def test_schedule_interleaves_with_cooldown_and_dates():
    projects = [{"topic": "home", "title": "A"}, {"topic": "pets", "title": "B"}, {"topic": "home", "title": "C"}]
    events = [{"project": p, "title": f"{p}{i}"} for p in "ABC" for i in range(2)]
    order = schedule(projects, events, 6, cooldown=1, seed=1)
    titles = [e["project"] for e in order]
    assert titles[:2] == ["A", "B"]  # A and B interleave; C (same topic as A) waits
    end_a = max(i for i, t in enumerate(titles) if t == "A")
    start_c = titles.index("C")
    assert start_c - end_a > 1  # a cool-down between two projects of one topic
    assert [e["title"] for e in order if e["project"] == "A"] == ["A0", "A1"]
    dates = [datetime.fromisoformat(e["date"]) for e in order]
    assert all(1 <= (b.date() - a.date()).days <= 3 for a, b in zip(dates, dates[1:], strict=False))


def test_dedupe_against_known_and_within_batch():
    points = [
        {"content": "The user adopted a grey cat named Pixel"},
        {"content": "User adopted grey cat Pixel"},
        {"content": "Kitchen budget is 5000 euros"},
    ]
    fresh, dupes = dedupe(points, ["The kitchen budget is 5000 euros"])
    assert [p["content"] for p in fresh] == ["The user adopted a grey cat named Pixel"]
    assert len(dupes) == 2
