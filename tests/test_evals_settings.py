"""Settings reach the frameworks an evaluation builds: every setting a framework reads, one default each (in Settings)."""

from __future__ import annotations

import pytest

from dualmem.config import Settings, setting_default
from dualmem.datasets import dump_rolememo, load_sample
from dualmem.evals.unit import default_framework
from dualmem.evaluate import run_eval
from dualmem.frameworks import FrameworkContext, open_framework
from dualmem.schema import Dataset
from dualmem.testing import HashEmbeddings, make_fake

# (framework, setting, value that differs from the default, attribute that must follow it)
READS = [
    ("dualmem", "retrieval_mode", "merged", lambda fw: fw.mode),
    ("full-context", "context_tokens", 1234, lambda fw: fw.max_tokens),
    ("raw-turns", "ranker", "fts", lambda fw: fw.ranker.spec),
    ("dualmem", "ranker", "hybrid", lambda fw: fw.ranker.spec),
    ("emotional-rag", "emotion_strategy", "S-E", lambda fw: fw.strategy),
    ("emotional-rag", "chunk_tokens", 300, lambda fw: fw.fragment_tokens),
    ("amem", "chunk_tokens", 300, lambda fw: fw.note_tokens),
    ("bookmarks", "chunk_tokens", 300, lambda fw: fw.read_tokens // 4),
]


@pytest.mark.parametrize(("name", "setting", "value", "read"), READS, ids=[f"{r[0]}-{r[1]}" for r in READS])
def test_a_framework_follows_the_settings_and_defaults_come_from_settings(name, setting, value, read, tmp_path):
    def build(settings: Settings):
        return open_framework(
            name,
            FrameworkContext(
                namespace=("p", "u"),
                settings=settings,
                embeddings=HashEmbeddings(64),
                chat_model=make_fake("memory"),
                store_uri=str(tmp_path / name),
            ),
        )

    assert read(build(Settings(embedder="hash:64", **{setting: value}))) == value
    default = setting_default(setting)
    if (name, setting) == ("emotional-rag", "emotion_strategy"):
        default = "C-A"  # empty means "no reranking" for dualmem; emotional-rag always ranks by emotion (the setting's help says so)
    assert read(build(Settings(embedder="hash:64"))) == default  # the one default lives in Settings


def test_dual_and_merged_retrieval_differ_as_the_setting_says(tmp_path):
    item = load_sample()
    frameworks = {}
    for mode in ("dual", "merged"):
        fw = open_framework(
            "dualmem",
            FrameworkContext(
                namespace=("p", "u"),
                persona=item.dialogue.persona,
                embeddings=HashEmbeddings(64),
                settings=Settings(embedder="hash:64", retrieval_mode=mode, chunk_tokens=200),
                chat_model=make_fake("memory"),
                store_uri=str(tmp_path / mode),
            ),
        )
        for session in item.dialogue.sessions:
            fw.ingest(session)
        frameworks[mode] = fw
    dual = [it.kind for it in frameworks["dual"].retrieve(item.queries[0].text, 6)]
    merged = frameworks["merged"].retrieve(item.queries[0].text, 6)
    assert sorted(dual) == ["fact"] * 3 + ["insight"] * 3  # k/2 of each stream
    assert len(merged) == 6 and [i.score for i in merged] == sorted(
        (i.score for i in merged), reverse=True
    )  # one ranked pool


def test_an_evaluation_builds_its_frameworks_with_the_run_settings(tmp_path):
    base = load_sample()
    data = dump_rolememo(Dataset(name="rolememo", items=[base]), tmp_path / "data")
    built = []

    def spy(name, item, ctx):
        built.append(default_framework(name, item, ctx))
        return built[-1]

    settings = Settings(embedder="hash:64", retrieval_mode="merged", retrieval_k=4, chunk_tokens=300)
    run = run_eval(
        "rolememo",
        data,
        "dualmem",
        out=tmp_path / "run",
        settings=settings,
        model=make_fake("memory"),
        similarity=HashEmbeddings(64),
        framework_factory=spy,
        progress=False,
        ragas=False,
    )
    [fw] = built
    assert fw.mode == "merged" and fw.context.settings == settings
    assert str(fw.context.uri).startswith(str(tmp_path / "run" / "lancedb"))
    import json

    meta = json.loads((run / "summary.json").read_text())["meta"]
    assert meta["retrieval_mode"] == "merged" and meta["settings"]["chunk_tokens"] == 300


def test_cli_set_types_values_and_names_the_fix(tmp_path):
    from typer.testing import CliRunner

    from dualmem.cli import _set_options, app

    assert _set_options(["retrieval_k=5", "retrieval-mode=merged", "temperature=0.5"]) == {
        "retrieval_k": 5,
        "retrieval_mode": "merged",
        "temperature": 0.5,
    }
    result = CliRunner().invoke(app, ["eval", str(tmp_path), "--set", "nope=1"])
    assert result.exit_code == 2 and "--set 'nope=1'" in result.output and "retrieval_mode=merged" in result.output
    result = CliRunner().invoke(app, ["eval", str(tmp_path), "--set", "retrieval_k=many"])
    assert result.exit_code == 2 and "not a valid int" in result.output
