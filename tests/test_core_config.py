from __future__ import annotations

import pickle
import re
from dataclasses import fields
from pathlib import Path

import pytest

from dualmem.cli.common import _set_options
from dualmem.config import GROUPS, EvalOptions, Settings, Tuning, setting_default, settings_by_object, settings_table
from dualmem.errors import ConfigurationError


def test_precedence_run_over_env_over_default(monkeypatch):
    monkeypatch.delenv("DUALMEM_RETRIEVAL_K", raising=False)
    assert Settings().tuning.retrieval_k == 10
    monkeypatch.setenv("DUALMEM_RETRIEVAL_K", "7")
    assert Settings().tuning.retrieval_k == 7
    assert Settings(retrieval_k=3).tuning.retrieval_k == 3
    assert Settings.resolve({"retrieval_k": 4}).tuning.retrieval_k == 4


def test_openai_aliases_are_read(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert Settings().openai_base_url == "http://127.0.0.1:9/v1"


def test_bad_values_name_the_fix(monkeypatch):
    monkeypatch.setenv("DUALMEM_CHUNK_TOKENS", "lots")
    with pytest.raises(ConfigurationError, match="DUALMEM_CHUNK_TOKENS"):
        Settings()
    monkeypatch.delenv("DUALMEM_CHUNK_TOKENS")
    with pytest.raises(ConfigurationError, match="retrieval_mode"):
        Settings(retrieval_mode="mixed")
    with pytest.raises(ConfigurationError, match="unknown settings"):
        Settings().replace(nope=1)


def test_role_models_fall_back_to_chat_model():
    s = Settings(chat_model="openai:gpt-4o-mini")
    assert s.writer == s.judge == "openai:gpt-4o-mini"
    assert Settings(chat_model="a:b", judge_model="c:d").judge == "c:d"


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        Settings().store_uri = "elsewhere"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        Settings().tuning.retrieval_k = 1  # type: ignore[misc]


def _docs_hooks():
    """Import docs/hooks.py (the MkDocs hooks that generate the configuration page's table)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "docs" / "hooks.py"
    spec = importlib.util.spec_from_file_location("dualmem_docs_hooks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_settings_table_matches_code():
    """The configuration page shows the table the hook builds, and the table has a row per setting, from the code."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    page = (docs / "configuration.md").read_text()
    assert page.count("<!-- settings-table -->") == 1, "docs/configuration.md lost its generated settings table"
    hooks = _docs_hooks()
    rendered = hooks.on_page_markdown(page)
    assert "<!-- settings-table -->" not in rendered
    rows = [line for line in hooks.settings_table().splitlines() if line.startswith("| `")]
    assert len(rows) == len(settings_table()), "one row per setting, no more"
    for name, var, default, help_text in settings_table():
        row = next((line for line in rows if line.startswith(f"| `{name}` ")), None)
        assert row is not None, f"the docs settings table lacks {name}"
        assert f"`{var}`" in row and f"`{default}`" in row, f"docs row of {name} drifted from code: {row}"
        assert help_text.replace("|", "\\|") in row and row in rendered
    for name in Settings.field_names():  # no hand-written table anywhere else in the docs to drift
        for other in docs.rglob("*.md"):
            if other.name != "configuration.md":
                assert not re.search(rf"^\| `{name}` \| `DUALMEM_", other.read_text(), re.M), (
                    f"{other} types a settings row"
                )


def test_three_objects_one_name_per_setting(monkeypatch):
    """A deployment's settings stay few; tuning and evaluation live in their own objects, and every setting keeps one
    name for its keyword, its environment variable and --set."""
    own = [f.name for f in fields(Settings) if f.name not in GROUPS]
    assert len(own) <= 20, own
    assert set(GROUPS) == {"tuning", "evaluation"}
    names = Settings.field_names()
    assert len(names) == len(set(names)) == len(own) + len(fields(Tuning)) + len(fields(EvalOptions))
    owners = {name: owner for owner, rows in settings_by_object().items() for name, *_ in rows}
    for name, var, _, _ in settings_table():  # every number settable from the environment and by --set
        value = setting_default(name)
        if type(value) not in (int, float):
            continue
        other = value + 1
        assert _set_options([f"{name}={other}"]) == {name: other}
        monkeypatch.setenv(var, str(other))
        s = Settings()
        owner = owners[name]
        assert (getattr(s, name) if owner == "settings" else getattr(getattr(s, owner), name)) == other, name
        monkeypatch.delenv(var)
    s = Settings(store_uri="db", chunk_tokens=300, framework="mem0")  # keywords go where each setting lives
    assert (s.store_uri, s.tuning.chunk_tokens, s.evaluation.framework) == ("db", 300, "mem0")
    assert s.replace(view_k=2, user_id="u").tuning.view_k == 2 and s.tuning.view_k == setting_default("view_k")
    assert Settings(tuning=Tuning(view_k=3), view_recent=1).tuning == Tuning(view_k=3, view_recent=1)
    assert pickle.loads(pickle.dumps(s)) == s and s.flat()["chunk_tokens"] == 300 and len(s.flat()) == len(names)
    with pytest.raises(ConfigurationError, match="concurrency must be >= 1"):
        Settings(concurrency=0)


def test_a_flat_read_of_a_tuning_or_evaluation_setting_fails_naming_its_place():
    """The flat reads warned for one minor release (0.4.x) and went in 0.5.0; the error says where the setting is."""
    s = Settings(chunk_tokens=256)
    assert s.tuning.chunk_tokens == 256
    with pytest.raises(AttributeError, match=r"it is settings\.tuning\.chunk_tokens"):
        s.chunk_tokens  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError, match=r"it is settings\.evaluation\.judge_model"):
        s.judge_model  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError, match=r"no attribute 'nope'$"):
        s.nope  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(s, "view_k") and getattr(s, "view_k", None) is None


def test_the_api_key_stays_out_of_the_repr():
    assert "sk-secret" not in repr(Settings(openai_api_key="sk-secret"))


def test_who_writes_memory():
    """One rule for the graphs, the evaluations and the run records: a model of its own writes when
    writer_model is set, or when the bundled chat model's adapter writes and no chat model object was given."""
    bundled = Settings(chat_model="local:smollm2", writer_model="", local_engine="auto")
    assert bundled.writer_for() == bundled.writer == "local:smollm2-writer"
    assert bundled.writer_for(chat_given=True) is None  # a chat model handed over also writes
    assert (
        Settings(chat_model="local:smollm2", writer_model="local:smollm2").writer_for(chat_given=True)
        == "local:smollm2"
    )
    assert Settings(chat_model="openai:gpt-4o-mini", writer_model="").writer_for() == "openai:gpt-4o-mini"
    assert (
        Settings(chat_model="local:smollm2", writer_model="", local_engine="llama.cpp").writer_for()
        == "local:smollm2-writer"
    )
