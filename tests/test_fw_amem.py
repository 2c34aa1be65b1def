"""amem: notes link to their nearest notes, neighbours evolve, retrieval follows links."""

from __future__ import annotations

import re

from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.frameworks.amem import AMemFramework
from dualmem.schema import Session, Turn
from dualmem.testing import FakeChatModel, HashEmbeddings

CAT = "my cat sleeps in the garden among the flowers"
STOCKS = "the stock market fell and my shares lost value"
CAT2 = "my cat hunts in the garden among the roses"


def _session(sid: str, texts: list[str]) -> Session:
    return Session(
        id=sid, time="2024-05-01", turns=[Turn(id=f"{sid}-t{i}", role="user", text=t) for i, t in enumerate(texts)]
    )


def _neighbours(prompt: str) -> dict[str, str]:
    return dict(re.findall(r"(M\d+):\n  content: user: (.*)", prompt))


class Script:
    """Annotate notes from their words; link (and evolve) the neighbours about cats."""

    def __init__(self, evolve: bool = True, fail_analysis_on: str | None = None) -> None:
        self.evolve = evolve
        self.fail_analysis_on = fail_analysis_on
        self.shown: list[dict[str, str]] = []

    def __call__(self, messages, tool):
        prompt = str(messages[1].content)
        if tool == "NoteAnalysis":
            if self.fail_analysis_on and self.fail_analysis_on in prompt:
                return "no json"
            words = re.findall(r"user: (.*)", prompt)[0].split()
            return {"keywords": words[1:3], "context": f"about {words[1]}", "tags": ["life"]}
        if tool == "Evolution":
            shown = _neighbours(prompt)
            self.shown.append(shown)
            new = prompt.split("<new>")[1].split("</new>")[0]
            cats = [label for label, text in shown.items() if "cat" in text] if " cat " in new else []
            updates = [{"label": lb, "context": "a cat story, now with roses", "tags": ["pets"]} for lb in cats]
            return {
                "links": cats,
                "tags": ["pets", "garden"],
                "should_evolve": self.evolve and bool(cats),
                "updates": updates,
            }
        return "ok"


def _framework(tmp_settings, script: Script, **kw) -> AMemFramework:
    context = FrameworkContext(
        namespace=("p", "u"),
        settings=tmp_settings.replace(chunk_tokens=16),
        chat_model=FakeChatModel(responses=[script], cycle=True),
        embeddings=HashEmbeddings(),
    )
    return AMemFramework(context, **kw)


def test_new_note_links_its_nearest_note_and_evolves_it(tmp_settings):
    script = Script()
    fw = _framework(tmp_settings, script, link_k=1)
    fw.ingest(_session("s1", [CAT, STOCKS]))
    report = fw.ingest(_session("s2", [CAT2]))
    assert report.items_written == 1 and not report.failed_chunks
    # with link_k=1 only the nearest note is shown: the cat note, not the stocks one
    assert list(script.shown[-1].values()) == [CAT]
    notes = {n["content"]: n for n in fw.notes()}
    old, new, stocks = notes[f"user: {CAT}"], notes[f"user: {CAT2}"], notes[f"user: {STOCKS}"]
    assert new["links"] == [old["id"]] and new["id"] in old["links"]
    assert stocks["links"] == [] or new["id"] not in stocks["links"]
    # evolution rewrote the neighbour's context and tags, and re-embedded it
    assert old["context"] == "a cat story, now with roses" and old["tags"] == ["pets"] and old["evolved"] == 1
    hit, score = fw.space.search("a cat story, now with roses pets", 1)[0]
    assert hit["id"] == old["id"] and score > 0.5  # found by its new context: it was re-embedded
    assert new["tags"] == ["pets", "garden"]


def test_neighbours_are_shown_cut_to_neighbour_tokens_but_the_new_note_whole(tmp_settings):
    from dualmem.models.tokens import count_tokens

    script = Script()
    fw = _framework(tmp_settings, script, link_k=1, neighbour_tokens=5)
    fw.ingest(_session("s1", [CAT]))
    fw.ingest(_session("s2", [CAT2]))
    [shown] = script.shown[-1].values()
    assert CAT.startswith(shown.strip()) and len(shown) < len(CAT) and count_tokens(f"user: {shown}") <= 5
    evolve = [c for c in fw.context.chat_model.calls if "<new>" in str(c[1].content)][-1]
    assert f"content: user: {CAT2}" in str(evolve[1].content)  # the new note itself is shown whole


def test_no_evolution_keeps_the_neighbour_unchanged(tmp_settings):
    fw = _framework(tmp_settings, Script(evolve=False))
    fw.ingest(_session("s1", [CAT]))
    fw.ingest(_session("s2", [CAT2]))
    notes = {n["content"]: n for n in fw.notes()}
    old = notes[f"user: {CAT}"]
    assert old["context"] == "about cat" and old["evolved"] == 0
    assert old["links"] == [notes[f"user: {CAT2}"]["id"]]


def test_retrieve_returns_hits_followed_by_linked_neighbours(tmp_settings):
    fw = _framework(tmp_settings, Script())
    fw.ingest(_session("s1", [CAT, STOCKS]))
    fw.ingest(_session("s2", [CAT2]))
    items = fw.retrieve("roses hunts", k=2)
    assert len(items) == 2
    assert items[0].text.startswith(f"user: {CAT2}") and items[0].meta["via"] is None
    assert items[1].text.startswith(f"user: {CAT}") and items[1].meta["via"] == items[0].id
    assert [i.source_session for i in items] == ["s2", "s1"]
    assert "Context:" in items[0].text
    assert len(fw.retrieve("roses", k=10)) == 3


def test_failed_analysis_is_recorded_and_the_note_kept(tmp_settings):
    fw = _framework(tmp_settings, Script(fail_analysis_on="stock"))
    report = fw.ingest(_session("s1", [CAT, STOCKS]))
    assert report.items_written == 2
    assert len(report.failed_chunks) == 1 and report.failed_chunks[0].endswith(":analyse")
    stocks = next(n for n in fw.notes() if "stock" in n["content"])
    assert stocks["keywords"] == [] and stocks["context"] == ""


def test_notes_survive_restart_and_reingest_adds_nothing(tmp_settings):
    fw = _framework(tmp_settings, Script())
    fw.ingest(_session("s1", [CAT, STOCKS]))
    chat = FakeChatModel(responses=[Script()], cycle=True)
    again = open_framework(
        "amem",
        FrameworkContext(
            namespace=("p", "u"),
            settings=tmp_settings.replace(chunk_tokens=16),
            chat_model=chat,
            embeddings=HashEmbeddings(),
        ),
    )
    assert len(again.notes()) == 2
    report = again.ingest(_session("s1", [CAT, STOCKS]))
    assert report.items_written == 0 and chat.calls == []
    again.reset()
    assert again.notes() == []
