"""memagent rewrites its memory after every chunk and never exceeds its token budget."""

from __future__ import annotations

import re

from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.frameworks.memagent import MemAgentFramework
from dualmem.models.tokens import count_tokens
from dualmem.schema import Session, Turn
from dualmem.testing import FakeChatModel, HashEmbeddings


def _session(sid: str, n: int) -> Session:
    turns = [
        Turn(
            id=f"{sid}-{i}",
            role="user" if i % 2 == 0 else "assistant",
            text=f"fact{sid}{i} " + "filler words here " * 8,
        )
        for i in range(n)
    ]
    return Session(id=sid, time="2024-05-01", turns=turns)


def _fw(tmp_settings, model, **kw) -> MemAgentFramework:
    chunk = (
        tmp_settings.tuning.chunk_tokens if tmp_settings.tuning.chunk_tokens != 1024 else 80
    )  # a test's own size wins
    settings = tmp_settings.replace(chunk_tokens=chunk, max_retries=1)
    ctx = FrameworkContext(namespace=("p", "u"), settings=settings, chat_model=model, embeddings=HashEmbeddings())
    return MemAgentFramework(ctx, **kw)


def _accumulate(messages):
    """Append the chunk's fact markers to the memory given in the prompt."""
    prompt = str(messages[-1].content)
    memory = prompt.split("<memory>")[1].split("</memory>")[0].strip()
    chunk = prompt.split("<chunk>")[1].split("</chunk>")[0] if "<chunk>" in prompt else ""
    new = re.findall(r"fact\w+", chunk)
    return "\n".join([m for m in [memory, " ".join(new)] if m])


def test_memory_is_rewritten_after_every_chunk(tmp_settings):
    model = FakeChatModel(responses=[_accumulate], cycle=True)
    fw = _fw(tmp_settings, model)
    session = _session("a", 8)
    report = fw.ingest(session)
    n_chunks = len(model.calls)
    assert n_chunks >= 3  # 8 turns of ~40 tokens in chunks of 80 tokens
    assert report.items_written == n_chunks and fw.version == n_chunks
    # each call saw the memory written by the previous one
    for prev, call in zip(model.calls, model.calls[1:], strict=False):
        marker = re.findall(r"facta\d", str(prev[-1].content).split("<chunk>")[1])[-1]
        assert marker in str(call[-1].content).split("<chunk>")[0]
    assert all(f"facta{i}" in fw.memory for i in range(8))
    # incremental: the same session again makes no call, a new one continues
    assert fw.ingest(session).meta["skipped"] == "session already ingested"
    assert len(model.calls) == n_chunks
    fw.ingest(_session("b", 2))
    assert "factb1" in fw.memory and "facta0" in fw.memory


def test_state_survives_a_restart(tmp_settings):
    model = FakeChatModel(responses=[_accumulate], cycle=True)
    fw = _fw(tmp_settings, model)
    fw.ingest(_session("a", 4))
    again = MemAgentFramework(fw.context)
    assert again.memory == fw.memory and again.version == fw.version
    calls = len(model.calls)
    again.ingest(_session("a", 4))
    assert len(model.calls) == calls


def test_budget_holds_when_model_ignores_it(tmp_settings):
    long_answer = " ".join(f"line{i}" for i in range(500))  # far over 50 tokens
    model = FakeChatModel(responses=[long_answer], cycle=True)
    fw = _fw(tmp_settings, model, memory_tokens=50)
    report = fw.ingest(_session("a", 4))
    assert 0 < count_tokens(fw.memory) <= 50
    assert report.meta["reasked"] >= 1 and report.meta["truncated"] >= 1
    # a re-ask message quoted the budget
    assert any("limit is 50" in str(call[-1].content) for call in model.calls)


def test_shortened_answer_is_kept_without_truncation(tmp_settings):
    answers = iter([" ".join(["too long"] * 200), "short memory"])
    model = FakeChatModel(responses=[lambda m: next(answers, "short memory")], cycle=True)
    fw = _fw(tmp_settings.replace(chunk_tokens=10_000), model, memory_tokens=50)
    report = fw.ingest(_session("a", 2))
    assert fw.memory == "short memory"
    assert report.meta["reasked"] == 1 and report.meta["truncated"] == 0 and report.llm_calls == 2


def test_model_failure_is_recorded_not_dropped(tmp_settings):
    model = FakeChatModel(responses=[RuntimeError("endpoint down")], cycle=True)
    fw = _fw(tmp_settings.replace(chunk_tokens=10_000), model)
    report = fw.ingest(_session("a", 2))
    assert len(report.failed_chunks) == 1 and fw.memory == ""
    assert "endpoint down" in report.meta["errors"][report.failed_chunks[0]]
    # the failed chunk is retried by the next ingest
    fw.context.chat_model = FakeChatModel(responses=["user likes tea"])
    assert fw.ingest(_session("a", 2)).failed_chunks == [] and fw.memory == "user likes tea"


def test_retrieve_ranks_memory_lines(tmp_settings):
    model = FakeChatModel(
        responses=["works night shifts at a warehouse\nloves hiking in the alps\nhas a cat named Miso"]
    )
    fw = _fw(tmp_settings.replace(chunk_tokens=10_000), model)
    fw.ingest(_session("a", 1))
    items = fw.retrieve("hiking in the alps", k=2)
    assert len(items) == 2 and items[0].text == "loves hiking in the alps"
    assert items[0].score >= items[1].score
    assert isinstance(open_framework("memagent", fw.context), MemAgentFramework)


def test_respond_runs_a_question_conditioned_pass(tmp_settings):
    def script(messages):
        prompt = str(messages[-1].content)
        if "Question:" in prompt:  # the focus pass sees the memory and the question
            assert "has a cat named Miso" in prompt and "cat's name" in prompt
            return "has a cat named Miso"
        if "<chunk>" in prompt:
            return "works night shifts\nhas a cat named Miso"
        return "Your cat is Miso."

    model = FakeChatModel(responses=[script], cycle=True)
    fw = _fw(tmp_settings.replace(chunk_tokens=10_000), model)
    fw.ingest(_session("a", 1))
    assert fw.respond("what is my cat's name?") == "Your cat is Miso."
    reader_prompt = "\n".join(str(m.content) for m in model.calls[-1])
    assert "has a cat named Miso" in reader_prompt and "night shifts" not in reader_prompt
    assert len(model.calls) == 3  # rewrite, focus pass, reader


def test_memory_lines_cite_the_session_that_first_wrote_them(tmp_settings):
    def script(messages):
        prompt = str(messages[-1].content)
        memory = prompt.split("<memory>")[1].split("</memory>")[0].strip()
        if "facta0" in prompt:  # session a: two lines
            return "works night shifts at a warehouse\nloves hiking in the alps"
        # session b: keeps the first line word for word, rewords the second, adds one
        assert "loves hiking in the alps" in memory
        return "works night shifts at a warehouse\nloves hiking in the Swiss alps\nhas a cat named Miso"

    fw = _fw(tmp_settings.replace(chunk_tokens=10_000), FakeChatModel(responses=[script], cycle=True))
    fw.ingest(_session("a", 1))
    assert {i.text: i.source_session for i in fw.retrieve("anything", k=5)} == {
        "works night shifts at a warehouse": "a",
        "loves hiking in the alps": "a",
    }
    fw.ingest(_session("b", 1))
    sources = {i.text: i.source_session for i in fw.retrieve("anything", k=5)}
    assert sources == {
        "works night shifts at a warehouse": "a",
        "loves hiking in the Swiss alps": "b",
        "has a cat named Miso": "b",
    }
    # the sources are state: a restarted framework cites the same sessions
    again = MemAgentFramework(fw.context)
    assert {i.text: i.source_session for i in again.retrieve("anything", k=5)} == sources


def test_memory_from_before_line_sources_cites_the_session_that_last_wrote_it(tmp_settings):
    fw = _fw(tmp_settings.replace(chunk_tokens=10_000), FakeChatModel(responses=["likes tea\nowns a bike"]))
    fw.space.set_values({"memory": {"text": "likes tea", "version": 3, "session_id": "old"}})  # older state layout
    fw.ingest(_session("new", 1))
    assert {i.text: i.source_session for i in fw.retrieve("anything", k=5)} == {
        "likes tea": "old",
        "owns a bike": "new",
    }
