"""The ``raw-turns`` framework on a real temporary LanceDB, with the bundled sample."""

from __future__ import annotations

import pytest

from dualmem.config import Settings
from dualmem.datasets import load_sample
from dualmem.errors import ConfigurationError
from dualmem.frameworks import FrameworkContext, available, open_framework
from dualmem.frameworks.raw_turns import RawTurnsFramework, turn_text
from dualmem.testing import HashEmbeddings


@pytest.fixture
def context(tmp_path):
    settings = Settings(store_uri=str(tmp_path / "lancedb"), embedder="hash:64")
    return FrameworkContext(namespace=("mara-okafor", "theo"), settings=settings, embeddings=HashEmbeddings(64))


def _ingest_sample(fw: RawTurnsFramework) -> int:
    item = load_sample()
    return sum(fw.ingest(s).items_written for s in item.dialogue.sessions)


def test_registered_and_opened_by_name(context):
    assert "raw-turns" in available()
    fw = open_framework("raw-turns", context)
    assert isinstance(fw, RawTurnsFramework) and fw.ranker.spec == context.settings.tuning.ranker == "learned"


def test_every_turn_stored_once_in_its_own_folder(context, tmp_path):
    fw = RawTurnsFramework(context)
    n_turns = sum(len(s.turns) for s in load_sample().dialogue.sessions)
    assert _ingest_sample(fw) == n_turns
    assert fw.count() == n_turns
    _ingest_sample(fw)  # re-ingesting replaces, never duplicates
    assert fw.count() == n_turns
    assert (tmp_path / "lancedb" / "raw-turns").is_dir()


@pytest.mark.parametrize("ranker", ["learned", "hybrid", "vector", "fts"])
def test_retrieves_the_verbatim_turn(context, ranker):
    fw = RawTurnsFramework(context, ranker=ranker)
    _ingest_sample(fw)
    item = load_sample()
    target = item.dialogue.sessions[3].turns[2]  # the red-light turn, searched by its own words
    hits = fw.retrieve(target.text, k=5)
    assert hits and len(hits) <= 5
    assert hits[0].id == target.id and hits[0].text == turn_text(target) == f"{target.speaker}: {target.text}"
    assert hits[0].kind == "turn" and hits[0].source_session == "s4"
    assert hits[0].meta["role"] == "user" and hits[0].meta["time"] == item.dialogue.sessions[3].time
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_namespaces_are_separate_and_reset_forgets(context):
    fw = RawTurnsFramework(context)
    _ingest_sample(fw)
    other = RawTurnsFramework(
        FrameworkContext(namespace=("mara-okafor", "someone"), settings=context.settings, embeddings=context.embeddings)
    )
    assert other.retrieve("pill organizer", k=3) == []
    fw.reset()
    assert fw.count() == 0 and fw.retrieve("pill organizer", k=3) == []


def test_user_only_indexing(context):
    fw = RawTurnsFramework(context, roles=("user",))
    _ingest_sample(fw)
    assert fw.count() == sum(t.role == "user" for s in load_sample().dialogue.sessions for t in s.turns)
    assert {h.meta["role"] for h in fw.retrieve("weekend plans", k=10)} == {"user"}


def test_bad_ranker_names_the_fix(context):
    with pytest.raises(ConfigurationError, match="learned .*vector.*hybrid.*fts"):
        RawTurnsFramework(context, ranker="bm25")


async def test_async_shell_matches_sync(context):
    fw = RawTurnsFramework(context)
    for s in load_sample().dialogue.sessions:
        await fw.aingest(s)
    assert [h.id for h in await fw.aretrieve("climbing sessions", k=3)] == [
        h.id for h in fw.retrieve("climbing sessions", k=3)
    ]
