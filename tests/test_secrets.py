"""No credential reaches an artifact: a unique secret planted in every credential-bearing setting and environment
variable DualMem reads, then ingest, eval (with its report), export, calibrate-judge and an MCP session on the bundled
sample (every model the loopback stand-in endpoint, reached with a key and a URL password), and every file written
(run folders, the store folder, the exports, the logs and the commands' output) is scanned: no secret appears."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from fixtures.standin import OpenAIStandin

pytestmark = pytest.mark.slow

SECRETS = {
    "OPENAI_API_KEY": "sk-PLANTED-openai-key-0001",
    "url_password": "PLANTED-url-pass-0002",
    "store_key_id": "PLANTED-store-keyid-0003",
    "store_secret": "PLANTED-store-secret-0004",
    "LANGSMITH_API_KEY": "PLANTED-langsmith-0005",
    "LANGCHAIN_API_KEY": "PLANTED-langchain-0006",
    "HF_TOKEN": "PLANTED-hf-token-0007",
    "ANTHROPIC_API_KEY": "PLANTED-anthropic-0008",
    "AWS_SECRET_ACCESS_KEY": "PLANTED-aws-secret-0009",
    "mcp_token": "PLANTED-mcp-token-0010",
    "formation_password": "PLANTED-formation-pass-0011",
}


def test_no_secret_in_any_file_a_run_writes(tmp_path):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from dualmem.datasets import sample_path

    SAMPLE_PATH = sample_path()

    with OpenAIStandin(latency_s=0.0) as endpoint:
        base = endpoint.base_url.replace("http://", f"http://planted:{SECRETS['url_password']}@")
        options = {"aws_access_key_id": SECRETS["store_key_id"], "aws_secret_access_key": SECRETS["store_secret"]}
        env = {
            **os.environ,
            "OPENAI_BASE_URL": base,
            "DUALMEM_STORE_URI": str(tmp_path / "store"),
            "DUALMEM_STORE_OPTIONS": json.dumps(options),
            "DUALMEM_EMBEDDER": "hash:64",
            "DUALMEM_CHECKPOINT_PATH": str(tmp_path / "ck.sqlite"),
            "DUALMEM_FORMATION_URL": f"http://u:{SECRETS['formation_password']}@127.0.0.1:9/",
            "DUALMEM_TOKENS": json.dumps({SECRETS["mcp_token"]: "alice"}),
            "LANGSMITH_TRACING": "false",
            "PYTHONPATH": str(REPO),
            **{k: v for k, v in SECRETS.items() if k.isupper()},
        }
        model = "openai-compatible:standin"
        outputs: list[str] = []

        def run(*args: str) -> None:
            done = subprocess.run(
                [sys.executable, "-m", "dualmem.cli", *args],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            outputs.append(done.stdout + done.stderr)
            assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])

        run("ingest", str(SAMPLE_PATH), "--model", model)
        run(
            "eval",
            str(SAMPLE_PATH),
            "-f",
            "dualmem",
            "--limit",
            "2",
            "--model",
            model,
            "--judge",
            model,
            "--no-upload",
            "--out",
            str(tmp_path / "run"),
        )
        run("export", "--persona", "mara-okafor", "--out", str(tmp_path / "export.json"))
        run("eval", "calibrate-judge", str(SAMPLE_PATH), "--judge", model, "--out", str(tmp_path / "calibration"))
        # a failing command's one-line error (a model that does not exist at the endpoint's URL) names no secret
        refused = {**env, "OPENAI_BASE_URL": f"http://planted:{SECRETS['url_password']}@127.0.0.1:9/v1"}
        failing = subprocess.run(
            [sys.executable, "-m", "dualmem.cli", "ask", "mara-okafor", "hi", "--model", model],
            cwd=tmp_path,
            env=refused,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert failing.returncode != 0
        outputs.append(failing.stdout + failing.stderr)

        async def mcp_session() -> None:
            params = StdioServerParameters(
                command=sys.executable,
                args=["-m", "dualmem.cli", "mcp", "--persona", "mara-okafor", "--user", "user"],
                env=env,
                cwd=str(tmp_path),
            )
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await session.call_tool("search_memory", {"query": "night shifts"})
                bad = await session.call_tool("forget", {"item_id": "no-such-item"})
                outputs.append(" ".join(getattr(c, "text", "") for c in bad.content))

        asyncio.run(mcp_session())

    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "run.json" for p in written) and any(p.name == "report.html" for p in written)
    assert (tmp_path / "export.json").is_file() and any(p.name == "calibration.json" for p in written)
    leaks = []
    for secret in SECRETS.values():
        needle = secret.encode()
        leaks += [str(p.relative_to(tmp_path)) for p in written if needle in p.read_bytes()]
        leaks += ["command output" for text in outputs if secret in text]
    assert not leaks, f"secrets written to: {sorted(set(leaks))}"
    recorded = json.loads(next(p for p in written if p.name == "run.json").read_text())
    assert "openai_api_key" not in json.dumps(recorded) and "***" in json.dumps(recorded["spec"]["settings"])


def test_a_resumed_run_takes_credentials_from_its_environment_not_its_files():
    from dualmem.config import Settings
    from dualmem.evals.runspec import RunSpec, recorded_settings, settings_of

    secret = json.dumps({"aws_secret_access_key": "PLANTED-resume-0012", "region": "eu-west-1"})
    spec = RunSpec("realmem", "x", "dualmem", settings=recorded_settings(Settings(store_options=secret)))
    assert "PLANTED" not in json.dumps(spec.settings) and "eu-west-1" in spec.settings["store_options"]
    assert settings_of(spec).store_options == Settings().store_options  # the environment's, never the masked text
    assert Path(REPO).is_dir()
