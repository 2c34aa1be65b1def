"""bookmarks: reuse instead of duplicating, derive a stale bookmark from the newer sessions only, create."""

from __future__ import annotations

import re

from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.frameworks.bookmarks import BookmarksFramework
from dualmem.schema import Session, Turn
from dualmem.testing import FakeChatModel, HashEmbeddings
from dualmem.writer.emotion import cosine

PET_Q = "What pet does the user have?"
PET_Q2 = "What pet does the user have now?"
S1 = ["I adopted a grey cat called Miso last spring", "work was busy with inventory counts all week"]
S2 = ["my neighbour gave me a puppy so now Miso has a dog friend", "the weather was rainy again"]


def _session(sid: str, texts: list[str], time: str = "2024-01-01") -> Session:
    return Session(id=sid, time=time, turns=[Turn(id=f"{sid}-t{i}", role="user", text=t) for i, t in enumerate(texts)])


class Script:
    """Propose scripted questions; answer from the pet lines of the excerpts; record every prompt."""

    def __init__(self, questions: list[list[str]] | None = None, fail: set[str] = frozenset()) -> None:
        self.questions = questions or [[PET_Q]]
        self.fail = fail
        self.prompts: list[tuple[str, str]] = []

    def __call__(self, messages, tool):
        prompt = str(messages[1].content)
        self.prompts.append((tool, prompt))
        if tool in self.fail:
            return "no json"
        if tool == "Questions":
            n = sum(t == "Questions" for t, _ in self.prompts)
            return {"questions": self.questions[min(n, len(self.questions)) - 1]}
        if tool == "BookmarkAnswer":
            pets = re.findall(r"(cat|puppy|dog)", prompt.split("Excerpts")[1])
            old = re.search(r"<answer>\n(.*)\n</answer>", prompt)
            if old and not pets:
                return {"answer": old.group(1), "changed": False}
            prefix = old.group(1) + " + " if old else ""
            return {
                "answer": prefix + ("pets: " + ", ".join(dict.fromkeys(pets)) if pets else "unknown"),
                "changed": True,
            }
        return "ok"


def _framework(tmp_settings, script: Script, **kw) -> BookmarksFramework:
    context = FrameworkContext(
        namespace=("p", "u"),
        settings=tmp_settings.replace(chunk_tokens=16),
        chat_model=FakeChatModel(responses=[script], cycle=True),
        embeddings=HashEmbeddings(),
    )
    return BookmarksFramework(context, **kw)


def _answer_calls(script: Script) -> list[str]:
    return [p for t, p in script.prompts if t == "BookmarkAnswer"]


def test_first_task_creates_a_bookmark_from_the_history(tmp_settings):
    script = Script()
    fw = _framework(tmp_settings, script)
    fw.ingest(_session("s1", S1))
    items = fw.retrieve("Should I get my pet a bigger bed?", k=3)
    assert [a for a, *_ in fw.last_actions] == ["create"]
    (mark,) = fw.bookmarks()
    assert mark["question"] == PET_Q and mark["answer"] == "pets: cat"
    assert mark["point"]["session"] == 1 and mark["point"]["session_id"] == "s1"
    assert items[0].kind == "insight" and items[0].text == f"Q: {PET_Q}\nA: pets: cat"
    assert items[0].source_session == "s1"
    assert [i.kind for i in items[1:]] == ["fact", "fact"] and items[1].meta["evidence"]


def test_same_question_reuses_the_bookmark_instead_of_duplicating(tmp_settings):
    assert cosine(HashEmbeddings().embed_query(PET_Q), HashEmbeddings().embed_query(PET_Q2)) >= 0.85
    script = Script(questions=[[PET_Q], [PET_Q2]])
    fw = _framework(tmp_settings, script, same_question=0.85)
    fw.ingest(_session("s1", S1))
    fw.retrieve("Should I get my pet a bigger bed?")
    first = fw.bookmarks()
    calls = len(_answer_calls(script))
    items = fw.retrieve("Is my pet lonely?")  # a paraphrase of the same question, same point
    assert [a for a, *_ in fw.last_actions] == ["reuse"]
    assert fw.bookmarks() == first  # no duplicate, nothing changed
    assert len(_answer_calls(script)) == calls  # reuse costs no answer call
    assert items[0].id == first[0]["id"]


def test_a_different_question_creates_a_second_bookmark(tmp_settings):
    script = Script(questions=[[PET_Q], ["Where does the user work?"]])
    fw = _framework(tmp_settings, script)
    fw.ingest(_session("s1", S1))
    fw.retrieve("pet bed?")
    fw.retrieve("job?")
    assert [a for a, *_ in fw.last_actions] == ["create"]
    assert len(fw.bookmarks()) == 2


def test_stale_bookmark_is_derived_from_the_newer_sessions_only(tmp_settings):
    script = Script()
    fw = _framework(tmp_settings, script)
    fw.ingest(_session("s1", S1))
    fw.retrieve("Should I get my pet a bigger bed?")
    (before,) = fw.bookmarks()
    fw.ingest(_session("s2", S2, time="2024-02-01"))
    items = fw.retrieve("Should I get my pet a bigger bed?")
    assert [a for a, *_ in fw.last_actions] == ["derive"]
    (after,) = fw.bookmarks()
    assert after["id"] == before["id"]
    assert after["answer"] == "pets: cat + pets: puppy, dog"
    assert after["point"]["session"] == 2 and after["derived"] == 1
    derive_prompt = _answer_calls(script)[-1]
    assert "<answer>\npets: cat\n</answer>" in derive_prompt
    excerpts = derive_prompt.split("Excerpts")[1]
    assert "puppy" in excerpts and not any(line in excerpts for line in S1)  # only sessions since its point
    assert set(items[0].source_sessions) == {"s1", "s2"}
    # brought up to date, it is reused until the story moves on again
    fw.retrieve("Should I get my pet a bigger bed?")
    assert [a for a, *_ in fw.last_actions] == ["reuse"]


def test_derive_that_changes_nothing_only_moves_the_point(tmp_settings):
    fw = _framework(tmp_settings, Script())
    fw.ingest(_session("s1", S1))
    fw.retrieve("pet?")
    fw.ingest(_session("s2", ["the weather was rainy again and the bus was late"]))
    fw.retrieve("pet?")
    (mark,) = fw.bookmarks()
    assert mark["answer"] == "pets: cat" and mark["point"]["session"] == 2


def test_failed_proposal_falls_back_to_the_task_and_is_recorded(tmp_settings):
    fw = _framework(tmp_settings, Script(fail={"Questions"}))
    fw.ingest(_session("s1", S1))
    fw.retrieve("Which pet do I have?")
    assert "propose" in fw.last_failures
    assert [m["question"] for m in fw.bookmarks()] == ["Which pet do I have?"]


def test_failed_answer_is_recorded_and_history_still_returned(tmp_settings):
    fw = _framework(tmp_settings, Script(fail={"BookmarkAnswer"}))
    fw.ingest(_session("s1", S1))
    items = fw.retrieve("cat", k=2)
    assert fw.last_actions == [("failed", PET_Q, None)] and any(k.startswith("create:") for k in fw.last_failures)
    assert fw.bookmarks() == []
    assert [i.kind for i in items] == ["fact", "fact"] and "cat" in items[0].text


def test_bookmarks_survive_restart_and_reingest_is_skipped(tmp_settings):
    fw = _framework(tmp_settings, Script())
    fw.ingest(_session("s1", S1))
    fw.retrieve("pet?")
    script = Script()
    again = open_framework(
        "bookmarks",
        FrameworkContext(
            namespace=("p", "u"),
            settings=tmp_settings.replace(chunk_tokens=16),
            chat_model=FakeChatModel(responses=[script], cycle=True),
            embeddings=HashEmbeddings(),
        ),
    )
    assert len(again.bookmarks()) == 1 and again.meta()["sessions"] == ["s1"]
    assert again.ingest(_session("s1", S1)).meta["skipped"]
    again.retrieve("pet?")
    assert [a for a, *_ in again.last_actions] == ["reuse"]
    again.reset()
    assert again.bookmarks() == [] and again.chunks() == []


def test_derive_over_an_empty_session_moves_the_point_without_a_call(tmp_settings):
    script = Script()
    fw = _framework(tmp_settings, script)
    fw.ingest(_session("s1", S1))
    fw.retrieve("pet?")
    calls = len(_answer_calls(script))
    fw.ingest(Session(id="s2", turns=[]))
    fw.retrieve("pet?")
    assert [a for a, *_ in fw.last_actions] == ["derive"] and len(_answer_calls(script)) == calls
    (mark,) = fw.bookmarks()
    assert mark["point"]["session"] == 2 and mark["answer"] == "pets: cat"
