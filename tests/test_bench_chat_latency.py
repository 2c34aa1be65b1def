"""benchmarks/chat_latency.py runs end to end on a small scale (RealMem Sophie_Dubois, hash embeddings)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REALMEM_SOPHIE, REPO, need


def test_the_chat_latency_benchmark_measures_memory_on_against_off(tmp_path):
    need(REALMEM_SOPHIE)
    out = tmp_path / "chat_latency.json"
    args = [
        "--data",
        str(REALMEM_SOPHIE.parent),
        "--persona",
        "Sophie_Dubois",
        "--embedder",
        "hash:64",
        "--queries",
        "6",
        "--warmup",
        "2",
        "--ttft",
        "0.05",
        "--tokens",
        "3",
        "--token-gap",
        "0.001",
        "--cache",
        str(tmp_path / "cache"),
        "--out",
        str(out),
    ]
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "chat_latency.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["namespace_items"] == {"facts": 1044, "insights": 595}  # every turn, every memory point
    assert result["on_turns"] == 2 * (6 + 2) and result["on_turns_with_recalled_memory"] == result["on_turns"]
    assert result["off_turns_with_recalled_memory"] == 0
    for mode in ("sync", "async"):
        figures = result["modes"][mode]
        assert figures["ttft_off"]["p50_ms"] >= 50  # the model's fixed latency
        assert figures["ttft_added"]["p50_ms"] > 0  # recall is not free
    for figure in ("retrieval_alone", "retrieval_after_idle"):  # back to back, and after the model's wait
        assert result[figure]["p50_ms"] > 0
    assert "retrieval alone" in run.stdout and "retrieval after idle" in run.stdout and "first token off" in run.stdout
