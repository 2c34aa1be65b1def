"""Evaluation harness: metrics, LLM judges, protocol runners, summaries, reports and plots.

Modules: ``metrics`` (pure metric functions), ``judges`` (LangSmith-compatible
LLM judges), ``runners`` (RealMem replay, LoCoMo, RoleMemo through the
``MemoryFramework`` interface), ``summary`` (aggregation), ``reports`` and
``plots`` (JSONL, summary.json, report.md, report.html, run comparison),
``langsmith_adapter`` (``langsmith.evaluate`` offline or uploaded), ``run``
(what ``dualmem eval`` calls) and ``fakes`` (a framework with a known ranking).
Import the module you need; nothing heavy is imported here.
"""
