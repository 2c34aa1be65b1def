"""Evaluation harness: metrics, LLM judges, protocol runners, summaries, reports, plots and personality tests.

Modules: ``metrics`` (pure metric functions), ``judges`` (LangSmith-compatible
LLM judges), ``runners`` (RealMem replay, LoCoMo, RoleMemo through the
``MemoryFramework`` interface), ``summary`` (aggregation), ``reports``,
``drilldown`` and ``plots`` (JSONL, summary.json, report.md, report.html with
the per-query drill-down), ``compare`` (runs side by side, deltas),
``langsmith_adapter`` (judges through ``langsmith.evaluate``, offline or
uploaded), ``journal`` and ``runspec`` (what a run is, where it lives, what it
finished: resume), ``run`` (what ``dualmem eval`` calls), ``progress`` (bars),
``incharacter``, ``personality`` and ``personality_run`` (InCharacter BFI /
16Personalities tests, ``dualmem eval personality``) and ``fakes`` (a
framework with a known ranking). Import the module you need; nothing heavy is
imported here.
"""
