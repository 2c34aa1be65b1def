"""`dualmem ui` in a real headless Chromium (Playwright driving the system Chromium) on the bundled sample: navigation
persona → user → insight → cited fact → source turn → history; the search's ranking equals the Python API's; export;
forget with confirmation; a second process's write on reload; hostile text shown as text; with tokens, one user's
session cannot reach another's memory by URL, form field or header, and no token means no page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO
from fixtures.chromium import FLAGS, chromium_binary
from fixtures.cli_server import cli_server

from dualmem.config import Settings
from dualmem.datasets import load_sample
from dualmem.schema import Fact
from dualmem.stores import LanceDualStore
from dualmem.testing import HashEmbeddings
from dualmem.writer import write_history

pytestmark = pytest.mark.slow
PERSONA = "mara-okafor"
TOKENS = {
    "tok-alice-0001": "alice",
    "tok-bob-000002": "bob",
    "tok-admin-0003": {"identity": "ops", "permissions": ["dualmem:admin"]},
}


def populate(root: Path) -> Settings:
    settings = Settings(store_uri=str(root / "db"), embedder="hash:64", checkpoint_path=str(root / "ck.sqlite"))
    sample = load_sample()
    dual = LanceDualStore(settings.store_uri, HashEmbeddings(64))
    for user in ("alice", "bob"):
        write_history(
            sample.dialogue.sessions,
            sample.dialogue.persona,
            settings=settings,
            store=dual,
            model="fake:memory",
            namespace=(PERSONA, user),
            progress=False,
        )
    return settings


@contextmanager
def ui_server(settings: Settings, tmp: Path, *extra: str) -> Iterator[str]:
    env = {
        **os.environ,
        "DUALMEM_STORE_URI": settings.store_uri,
        "DUALMEM_EMBEDDER": "hash:64",
        "DUALMEM_CHECKPOINT_PATH": settings.checkpoint_path,
        "PYTHONPATH": str(REPO),
    }
    with cli_server(["ui", *extra], env, tmp / f"ui-{len(list(tmp.glob('ui-*.log')))}.log") as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    exe = chromium_binary()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=[f for f in FLAGS if not f.startswith("--remote-debugging")])
        yield b
        b.close()


def test_navigate_search_export_forget_and_fresh_reads(browser, tmp_path):
    from dualmem.retrieval import Ranker

    settings = populate(tmp_path)
    dual = LanceDualStore(settings.store_uri, HashEmbeddings(64))
    with ui_server(settings, tmp_path) as url:
        page = browser.new_page(accept_downloads=True)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.get_by_role("link", name=PERSONA).click()
        page.get_by_role("link", name="alice").click()
        assert "insights" in page.locator(".counts").inner_text()
        page.select_option("select[name=kind]", "insight")
        page.get_by_role("button", name="Filter").click()
        page.locator("table.items a").first.click()  # an insight
        assert page.locator("h1 .tag").inner_text() == "insight"
        page.locator("ul.cards a").first.click()  # a fact it cites
        assert page.locator("h1 .tag").inner_text() == "fact"
        turn = page.locator("ul.turns li").first.inner_text()
        assert "turn" in turn and "Theo:" in turn, turn  # the source turn's session, time and words
        assert page.locator("table.history tbody tr").first.inner_text().startswith("ADD")

        # search: the same ranking as the Python API for the same query
        query = "night shifts and sleep"
        page.goto(f"{url}/p/{PERSONA}/u/alice")
        page.keyboard.press("/")
        page.keyboard.type(query)
        page.keyboard.press("Enter")
        page.wait_for_url("**/search?q=*")
        shown = page.locator("ol.ranked li").evaluate_all("els => els.map(e => e.dataset.id)")
        api = [
            h.item.id
            for h in Ranker.from_settings(settings).rank(dual, (PERSONA, "alice"), query, settings.tuning.retrieval_k)
        ]
        assert shown == api and shown

        # a write by another process (this one) appears on reload
        page.goto(f"{url}/p/{PERSONA}/u/alice")
        dual.upsert([Fact(id="fresh-1", namespace=(PERSONA, "alice"), text="adopted a grey cat named Pixel")])
        page.reload()
        assert "adopted a grey cat named Pixel" in page.locator("table.items").inner_text()

        # export: the same file as `dualmem export`
        with page.expect_download() as info:
            page.get_by_role("link", name="Export").click()
        exported = json.loads(Path(info.value.path()).read_text())
        assert exported["format"] == "dualmem.export" and exported["namespace"] == {"persona": PERSONA, "user": "alice"}
        assert len(exported["items"]) == dual.count((PERSONA, "alice"), status=None)

        # forget with confirmation: a wrong confirmation forgets nothing, the right one everything
        page.get_by_role("link", name="Forget this user…").click()
        page.fill("#confirm", "bob")
        page.get_by_role("button", name="Forget for good").click()
        assert dual.count((PERSONA, "alice")) > 0
        page.wait_for_load_state()
        page.fill("#confirm", "alice")
        page.get_by_role("button", name="Forget for good").click()
        assert "Forgotten" in page.locator("h1").inner_text()
        assert dual.count((PERSONA, "alice"), status=None) == 0 and dual.count((PERSONA, "bob")) > 0
        page.goto(f"{url}/p/{PERSONA}")
        assert "alice" not in page.locator("table").inner_text() and "bob" in page.locator("table").inner_text()
        assert not errors


def test_hostile_text_is_shown_as_text(browser, tmp_path):
    settings = populate(tmp_path)
    dual = LanceDualStore(settings.store_uri, HashEmbeddings(64))
    hostile = [
        "<script>window.__pwned = 1</script>",
        '<img src=x onerror="window.__pwned = 2">',
        "\u202eevil right-to-left \u200f mark",
        "x" * 5000,
        '"><a href="javascript:window.__pwned=3">click</a>',
    ]
    dual.upsert([Fact(id=f"h{i}", namespace=(PERSONA, "alice"), text=t) for i, t in enumerate(hostile)])
    with ui_server(settings, tmp_path) as url:
        page = browser.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(f"{url}/p/{PERSONA}/u/alice")
        text = page.locator("table.items").inner_text()
        for t in hostile[:3]:
            assert t in text
        assert page.evaluate("window.__pwned") is None and not dialogs
        assert page.locator("table.items img").count() == 0 and page.locator("table.items script").count() == 0
        page.goto(f"{url}/p/{PERSONA}/u/alice/i/h1")
        assert page.locator("h1 .text").inner_text() == hostile[1]
        assert page.evaluate("window.__pwned") is None
        width = page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        page.goto(f"{url}/p/{PERSONA}/u/alice/i/h3")
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1") and width


def test_with_tokens_a_user_reaches_only_their_own_memory(browser, tmp_path):
    import httpx

    settings = populate(tmp_path)
    (tmp_path / "tokens.json").write_text(json.dumps(TOKENS))
    with ui_server(settings, tmp_path, "--tokens", str(tmp_path / "tokens.json")) as url:
        assert httpx.get(f"{url}/").status_code == 401, "no token: no page"
        assert httpx.get(f"{url}/p/{PERSONA}/u/alice").status_code == 401
        page = browser.new_page()
        page.goto(url)
        page.fill("#token", "tok-alice-0001")
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("link", name=PERSONA).click()
        assert "alice" in page.locator("table").inner_text() and "bob" not in page.locator("table").inner_text()
        for path in ("", "/i/x", "/search?q=night", "/export", "/forget"):
            assert page.goto(f"{url}/p/{PERSONA}/u/bob{path}").status == 404, path
        # a forged form: alice's own CSRF token, bob's namespace
        page.goto(f"{url}/p/{PERSONA}/u/alice/forget")
        csrf = page.locator("#main input[name=csrf]").input_value()
        cookie = {c["name"]: c["value"] for c in page.context.cookies()}
        forged = httpx.post(f"{url}/p/{PERSONA}/u/bob/forget", data={"csrf": csrf, "confirm": "bob"}, cookies=cookie)
        assert forged.status_code == 404
        # without the CSRF token even her own forget is refused
        assert (
            httpx.post(f"{url}/p/{PERSONA}/u/alice/forget", data={"confirm": "alice"}, cookies=cookie).status_code
            == 403
        )
        # headers cannot widen it: a claimed user header, bob's path
        sneaky = httpx.get(
            f"{url}/p/{PERSONA}/u/bob", headers={"Authorization": "Bearer tok-alice-0001", "X-DualMem-User": "bob"}
        )
        assert sneaky.status_code == 404
        dual = LanceDualStore(settings.store_uri, HashEmbeddings(64))
        assert dual.count((PERSONA, "bob")) > 0
        admin = httpx.get(f"{url}/p/{PERSONA}/u/bob", headers={"Authorization": "Bearer tok-admin-0003"})
        assert admin.status_code == 200 and "bob" in admin.text
        assert httpx.get(f"{url}/", headers={"Host": "evil.example"}).status_code == 400, "DNS rebinding: Host checked"


def test_beyond_loopback_without_tokens_is_refused_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "dualmem.cli", "ui", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DUALMEM_STORE_URI": str(tmp_path / "db")},
    )
    assert done.returncode == 2 and "--tokens" in done.stderr and len(done.stderr.strip().splitlines()) == 1
