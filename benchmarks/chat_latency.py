"""Hot-path cost of chat memory: a reply's time to first token with DualMemMiddleware on versus off.

Both agents are ``langchain.agents.create_agent`` runs on the same LanceDB store,
streamed (``stream_mode="messages"``, sync and async) with a chat model that
answers after a fixed latency (``--ttft`` seconds to its first token, then
``--tokens`` tokens ``--token-gap`` seconds apart). Memory on = the product's
``DualMemMiddleware``: recall before the model (the chat path's retrieval,
:func:`dualmem.chat.recall.recall_for_chat`, with the bundled embedder) and,
after the reply, the exchange handed over to formation (stored as pending
turns; the executor's write is planned for the quiet time, so no writer runs
during the measurement). Memory off = the same agent without the middleware.

The namespace holds a whole RealMem persona (default Sarah_Miller, the largest):
every turn of its history verbatim as a fact and every extracted memory point
as an insight citing the turn it came from. Queries are the persona's own
questions, each in a new thread; on and off alternate query by query, after
``--warmup`` unmeasured queries. The ranker's remembered query vectors are
dropped before every measured turn and recall (questions repeat across modes
and cycles), so each message is embedded, as a user's new message is. Reported per mode: time to first token (p50,
p95) on and off, the paired difference, the time after the last token (the
hand-over), and the retrieval alone on the same queries, twice: back to back in
the main thread, and as a chat turn meets it (in a worker thread, after the
model's wait; a retrieval that follows idle time runs slower than one that
follows another, so the paired difference is compared with that one).

Run: ``python benchmarks/chat_latency.py [--persona Sarah_Miller] [--queries 150]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _lib.embedding_cache import DEFAULT_FOLDER, EmbeddingCache  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult  # noqa: E402

from dualmem.chat import DualMemMiddleware, FormationExecutor  # noqa: E402
from dualmem.chat.recall import recall_for_chat  # noqa: E402
from dualmem.config import Settings  # noqa: E402
from dualmem.datasets import load_realmem  # noqa: E402
from dualmem.models import BUNDLED_EMBEDDER, load_embeddings  # noqa: E402
from dualmem.prompts.respond import render_respond_system  # noqa: E402
from dualmem.retrieval.pipeline import Ranker  # noqa: E402
from dualmem.schema import DatasetItem, Fact, Insight, SourceRef  # noqa: E402
from dualmem.stores import LanceDBStore, LanceDualStore  # noqa: E402

DATA = REPO / ".." / "shared" / "data" / "realmem"
OUT = REPO / "benchmarks" / "results" / "chat_latency.json"
TARGET_RETRIEVAL_P50_MS = 50.0
TARGET_ADDED_P50_MS = 50.0  # the issue: time to first token grows by no more than the retrieval (<= 50 ms p50)


class FixedLatencyModel(BaseChatModel):
    """A chat model whose first token comes after ``ttft`` seconds, then ``tokens`` tokens ``gap`` seconds apart."""

    ttft: float = 0.3
    tokens: int = 20
    gap: float = 0.01
    systems: list[str] = []  # the system prompt of every call (to check that recalled memory reached it)

    @property
    def _llm_type(self) -> str:
        return "fixed-latency"

    def _words(self) -> list[str]:
        return [f"word{i} " for i in range(self.tokens)]

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        time.sleep(self.ttft + self.gap * (self.tokens - 1))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="".join(self._words())))])

    def _stream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        self.systems.append(str(messages[0].content) if messages and messages[0].type == "system" else "")
        for i, word in enumerate(self._words()):
            time.sleep(self.ttft if i == 0 else self.gap)
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word))
            if run_manager:
                run_manager.on_llm_new_token(word, chunk=chunk)
            yield chunk

    async def _astream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        self.systems.append(str(messages[0].content) if messages and messages[0].type == "system" else "")
        for i, word in enumerate(self._words()):
            await asyncio.sleep(self.ttft if i == 0 else self.gap)
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word))
            if run_manager:
                await run_manager.on_llm_new_token(word, chunk=chunk)
            yield chunk


def fill(store: LanceDualStore, item: DatasetItem, namespace: tuple[str, str], cache_folder: Path) -> dict[str, int]:
    """Write the persona's whole history into ``namespace``: turns as facts, memory points as insights."""
    facts, insights = [], []
    for session in item.dialogue.sessions:
        for turn in session.turns:
            facts.append(
                Fact(
                    id=turn.id,
                    namespace=namespace,
                    text=turn.text,
                    event_time=session.time,
                    source=SourceRef(session_id=session.id, turn_ids=[turn.id]),
                )
            )
        ids = [t.id for t in session.turns]
        for point in session.memory_points:
            cited = (
                f"{session.id}:{point.source_turn}"
                if point.source_turn is not None and f"{session.id}:{point.source_turn}" in ids
                else ids[0]
            )
            insights.append(
                Insight(
                    id=point.id,
                    namespace=namespace,
                    text=point.content,
                    grounding=[cited],
                    source=SourceRef(session_id=session.id, turn_ids=[cited]),
                )
            )
    items = [*facts, *insights]
    cache = EmbeddingCache(store.embeddings, cache_folder)
    vectors = cache.embed([i.text for i in items], progress="embedding the persona's memory")
    for start in range(0, len(items), 2000):
        store.upsert(items[start : start + 2000], vectors=vectors[start : start + 2000].tolist())
    store.maintain()
    return {"facts": len(facts), "insights": len(insights)}


RANKERS: list[Any] = []  # the chat path's ranker (set by main)


def forget_queries() -> None:
    """Drop remembered query vectors, so each measured message is embedded, as a user's new message is."""
    for ranker in RANKERS:
        ranker.forget()


def pct(values: list[float], q: float) -> float:
    """Return the ``q`` quantile (0..1) in milliseconds."""
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": pct(values, 0.5),
        "p95_ms": pct(values, 0.95),
        "mean_ms": round(1000 * statistics.fmean(values), 1),
    }


def _first_token(chunk: Any, meta: dict[str, Any]) -> bool:
    return isinstance(chunk, AIMessageChunk) and meta.get("langgraph_node") == "model" and bool(chunk.content)


def timed(agent: Any, text: str, thread: str) -> tuple[float, float]:
    """Return (time to first token, total time) of one streamed turn."""
    forget_queries()
    start, first = time.perf_counter(), None
    for chunk, meta in agent.stream(
        {"messages": [HumanMessage(text)]},
        {"configurable": {"thread_id": thread}},
        context={"user_id": "bench"},
        stream_mode="messages",
    ):
        if first is None and _first_token(chunk, meta):
            first = time.perf_counter() - start
    return first or float("nan"), time.perf_counter() - start


async def atimed(agent: Any, text: str, thread: str) -> tuple[float, float]:
    """Async :func:`timed`."""
    forget_queries()
    start, first = time.perf_counter(), None
    async for chunk, meta in agent.astream(
        {"messages": [HumanMessage(text)]},
        {"configurable": {"thread_id": thread}},
        context={"user_id": "bench"},
        stream_mode="messages",
    ):
        if first is None and _first_token(chunk, meta):
            first = time.perf_counter() - start
    return first or float("nan"), time.perf_counter() - start


def measure(agents: dict[str, Any], queries: list[str], warmup: int, mode: str) -> dict[str, list[tuple[float, float]]]:
    """Stream every query through each agent, alternating agents query by query."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in agents}
    for i, text in enumerate([*queries[:warmup], *queries]):
        for name, agent in list(agents.items()) if i % 2 == 0 else list(agents.items())[::-1]:
            thread = f"{mode}-{name}-{i}"
            pair = asyncio.run(atimed(agent, text, thread)) if mode == "async" else timed(agent, text, thread)
            if i >= warmup:
                out[name].append(pair)
    return out


def retrieval_laps(
    dual: LanceDualStore, namespace: tuple[str, str], queries: list[str], settings: Settings, idle_s: float
) -> list[float]:
    """Time the chat path's retrieval of each query alone, as in the agents' turns (a new thread: no earlier turns;
    the query not remembered). ``idle_s`` > 0: each retrieval runs in a worker thread after that long idle, as the
    agent's hook runs (LangGraph's worker thread, the previous turn's model wait before it); 0: back to back."""

    def lap(text: str) -> float:
        forget_queries()
        start = time.perf_counter()
        recall_for_chat(dual, namespace, text, [], settings)
        return time.perf_counter() - start

    if not idle_s:
        return [lap(text) for text in queries]
    laps = []
    with ThreadPoolExecutor(max_workers=1) as worker:
        for text in queries:
            time.sleep(idle_s)
            laps.append(worker.submit(lap, text).result())
    return laps


def main() -> None:
    """Run the benchmark; print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA, help="RealMem folder")
    parser.add_argument(
        "--persona", default="Sarah_Miller", help="RealMem persona whose whole history fills the namespace"
    )
    parser.add_argument(
        "--queries", type=int, default=150, help="queries measured per mode (the persona's own questions, cycled)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=20,
        help="unmeasured queries first (a fresh process prepares each padded query length once)",
    )
    parser.add_argument("--ttft", type=float, default=0.3, help="the model's fixed time to first token, seconds")
    parser.add_argument("--tokens", type=int, default=20, help="tokens per reply")
    parser.add_argument("--token-gap", type=float, default=0.01, help="seconds between tokens")
    parser.add_argument("--embedder", default=BUNDLED_EMBEDDER, help="the store's embedder (default: the bundled one)")
    parser.add_argument("--modes", default="sync,async", help="stream / astream")
    parser.add_argument(
        "--cache", type=Path, default=REPO / DEFAULT_FOLDER, help="embedding cache of the persona's memory"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    path = args.data / f"{args.persona}_dialogues_256k.json"
    if not path.exists():
        raise SystemExit(f"{path} not found: the benchmark needs the RealMem personas of ../shared/data")

    item = load_realmem(path).items[0]
    persona = item.dialogue.persona
    assert persona is not None
    namespace = (persona.id, "bench")
    questions = [q.text for q in item.queries] or [
        t.text for s in item.dialogue.sessions for t in s.turns if t.role == "user"
    ]
    queries = [questions[i % len(questions)] for i in range(args.queries)]
    load_before = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="chat-latency-") as tmp:
        settings = Settings(store_uri=f"{tmp}/db", embedder=args.embedder, formation_idle_s=10**6, chunk_tokens=10**9)
        dual = LanceDualStore(settings.store_uri, load_embeddings(args.embedder, settings))
        sizes = fill(dual, item, namespace, args.cache)
        store = LanceDBStore.over(dual)
        RANKERS.append(Ranker.from_settings(settings))
        models = {
            name: FixedLatencyModel(ttft=args.ttft, tokens=args.tokens, gap=args.token_gap, systems=[])
            for name in ("off", "on")
        }
        formation = FormationExecutor(workers=1)  # its writes wait for the quiet time: none during the measurement
        agents = {
            "off": create_agent(models["off"], [], system_prompt=render_respond_system(persona, ""), store=store),
            "on": create_agent(
                models["on"],
                [],
                middleware=[DualMemMiddleware(persona, settings=settings, formation=formation)],
                store=store,
            ),
        }
        results: dict[str, Any] = {}
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            runs = measure(agents, queries, args.warmup, mode)
            ttft = {name: [p[0] for p in pairs] for name, pairs in runs.items()}
            after = {name: [p[1] - p[0] for p in pairs] for name, pairs in runs.items()}
            diff = [on - off for on, off in zip(ttft["on"], ttft["off"], strict=True)]
            results[mode] = {
                "ttft_off": summary(ttft["off"]),
                "ttft_on": summary(ttft["on"]),
                "ttft_added": summary(diff),
                "after_last_token_off": summary(after["off"]),
                "after_last_token_on": summary(after["on"]),
            }
        recall = retrieval_laps(dual, namespace, queries, settings, idle_s=0.0)
        idle = retrieval_laps(dual, namespace, queries, settings, idle_s=args.ttft)
        formation.shutdown()
    retrieval, after_idle = summary(recall), summary(idle)
    modes_ok = {m: r["ttft_added"]["p50_ms"] <= TARGET_ADDED_P50_MS for m, r in results.items()}
    within = {m: r["ttft_added"]["p50_ms"] <= after_idle["p50_ms"] + 5.0 for m, r in results.items()}
    result = {
        "benchmark": "time to first token of a create_agent reply with DualMemMiddleware on vs off (fixed-latency model)",
        "command": f"python benchmarks/chat_latency.py --persona {args.persona} --queries {args.queries} --warmup {args.warmup} "
        f"--ttft {args.ttft} --tokens {args.tokens} --token-gap {args.token_gap} --modes {args.modes}",
        "persona": args.persona,
        "namespace_items": sizes,
        "embedder": args.embedder,
        "queries": args.queries,
        "model": {"ttft_s": args.ttft, "tokens": args.tokens, "token_gap_s": args.token_gap},
        "retrieval_alone": retrieval,
        "retrieval_after_idle": after_idle,
        "modes": results,
        "on_turns_with_recalled_memory": sum(1 for p in models["on"].systems if "because: " in p),
        "on_turns": len(models["on"].systems),
        "off_turns_with_recalled_memory": sum(1 for p in models["off"].systems if "because: " in p),
        "target": {
            "retrieval_p50_ms": TARGET_RETRIEVAL_P50_MS,
            "ttft_added_p50_ms": TARGET_ADDED_P50_MS,
            "ttft_added_within_retrieval": "added p50 <= retrieval after idle p50 + 5 ms",
        },
        "passed": {
            "retrieval": retrieval["p50_ms"] <= TARGET_RETRIEVAL_P50_MS,
            **{f"ttft_added_{m}": ok for m, ok in modes_ok.items()},
            **{f"ttft_added_within_retrieval_{m}": ok for m, ok in within.items()},
        },
        "load_average_1min": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"namespace: {args.persona}, {sizes['facts']} facts + {sizes['insights']} insights; embedder {args.embedder}; "
        f"{args.queries} queries per mode; model: first token after {args.ttft * 1000:.0f} ms"
    )
    print(
        f"retrieval alone:      p50 {retrieval['p50_ms']} ms, p95 {retrieval['p95_ms']} ms (target p50 <= {TARGET_RETRIEVAL_P50_MS:.0f} ms)"
    )
    print(
        f"retrieval after idle: p50 {after_idle['p50_ms']} ms, p95 {after_idle['p95_ms']} ms "
        f"(in a worker thread, {args.ttft * 1000:.0f} ms after the previous one, as in a chat turn)"
    )
    for mode, r in results.items():
        print(
            f"[{mode}] first token off: p50 {r['ttft_off']['p50_ms']} ms; on: p50 {r['ttft_on']['p50_ms']} ms; "
            f"added: p50 {r['ttft_added']['p50_ms']} ms, p95 {r['ttft_added']['p95_ms']} ms; "
            f"after the last token off/on: p50 {r['after_last_token_off']['p50_ms']} / {r['after_last_token_on']['p50_ms']} ms"
        )
    print("passed:", ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in result["passed"].items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
