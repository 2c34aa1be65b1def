"""Screenshots of the memory browser for the docs, made at build time from the bundled sample (never committed).

The sample is written into a temporary store (the offline ``fake:memory`` writer, hash embeddings), ``dualmem ui``
serves it on a free loopback port, and headless Chromium (Debian's, as the tests use; ``make chromium``) captures
the pages through Playwright.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SHOTS = {  # file name -> page (relative to the user's memory) and what it shows
    "browser-items.png": "",
    "browser-insight.png": "/i/{insight}",
    "browser-search.png": "/search?q=tired+after+night+shifts",
}
PERSONA, USER = "mara-okafor", "theo"


def screenshots() -> dict[str, bytes]:
    """Return the PNG of each page of :data:`SHOTS`."""
    chromium = os.environ.get("DUALMEM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("docs: the memory browser's screenshots need Chromium: run `make chromium`")
    from playwright.sync_api import sync_playwright

    from dualmem.config import Settings
    from dualmem.datasets import load_sample
    from dualmem.stores import LanceDualStore
    from dualmem.testing import HashEmbeddings
    from dualmem.writer import write_history

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(store_uri=f"{tmp}/db", embedder="hash:64", checkpoint_path=f"{tmp}/ck.sqlite")
        sample = load_sample()
        dual = LanceDualStore(settings.store_uri, HashEmbeddings(64))
        write_history(
            sample.dialogue.sessions,
            sample.dialogue.persona,
            settings=settings,
            store=dual,
            model="fake:memory",
            namespace=(PERSONA, USER),
            progress=False,
        )
        insight = dual.list((PERSONA, USER), "insight")[0].id
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {**os.environ, "DUALMEM_STORE_URI": settings.store_uri, "DUALMEM_EMBEDDER": "hash:64"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "dualmem.cli", "ui", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 90
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.time() > deadline:
                        raise RuntimeError("docs: `dualmem ui` did not start for the screenshots") from None
                    time.sleep(0.2)
            base = f"http://127.0.0.1:{port}/p/{PERSONA}/u/{USER}"
            out = {}
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1200, "height": 760})
                for name, path in SHOTS.items():
                    page.goto(base + path.format(insight=insight))
                    out[name] = page.screenshot()
                browser.close()
            return out
        finally:
            proc.terminate()
            proc.wait(timeout=20)
