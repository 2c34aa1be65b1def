"""What ``dualmem eval personality SOURCE`` runs: InCharacter tests of role-play agents with and without memory.

SOURCE is one of:

- InCharacter's data folder (``characters.json``): its 32 labelled characters,
  each an agent with a name and no history, so only the ``no-memory``
  condition; fidelity against ``characters_labels.json`` (expert
  ``annotation`` labels, or ``pdb`` crowd votes);
- a dataset (``--dataset``): each persona's agent is interviewed twice —
  ``memory``: the framework after ingesting the persona's history (or its
  first ``sessions`` sessions), ``no-memory``: the same framework on an empty
  store; fidelity against the persona file's ``personality`` labels or a
  ``--labels`` file;
- a ``dualmem eval`` run folder: its framework and settings, its already
  ingested memory as the ``memory`` condition.

The folder keeps ``run.json`` (the spec; the same command continues the same
test), ``journal.sqlite`` (every answer and rating, once),
``personality.json`` (per subject, condition, questionnaire and dimension:
score, type, batches with the judge's analysis, label), ``interviews.jsonl``
and ``personality.md`` (InCharacter's Acc_dim, Acc_full, normalised MAE and
MSE per condition, and how far the two conditions agree).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from dualmem.config import Settings
from dualmem.datasets import load_dataset
from dualmem.errors import ConfigurationError
from dualmem.evals import incharacter as ic
from dualmem.evals.journal import JOURNAL, Journal
from dualmem.evals.personality import assess, interview
from dualmem.evals.progress import progress_bars
from dualmem.evals.reports import fmt, md_table
from dualmem.evals.runners import RunOptions, ingest_sessions
from dualmem.evals.runspec import (
    OPERATIONAL,
    claim,
    data_stamp,
    fingerprint,
    read_run,
    recorded_settings,
    run_store,
    settings_of,
    spec_of,
)
from dualmem.evals.unit import persona_store
from dualmem.frameworks import FrameworkContext, MemoryFramework, open_framework
from dualmem.models import load_chat_model, model_name
from dualmem.schema import Persona, Session

RESULTS, INTERVIEWS, REPORT = "personality.json", "interviews.jsonl", "personality.md"


@dataclass
class PersonalitySpec:
    """Everything that changes a personality test's results (see :mod:`dualmem.evals.runspec`)."""

    source: str
    mode: str  # incharacter | dataset | run
    dataset_kind: str
    framework: str
    questionnaires: list[str]
    sessions: int | None = None
    personas: list[str] = field(default_factory=list)
    chat_model: str = ""
    judge_model: str = ""
    label_source: str = "annotation"
    labels_file: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    stamp: str = ""


@dataclass
class Subject:
    """One agent under test: its persona, names to hide from the judge, labels, and how to open each condition."""

    id: str
    persona: Persona
    names: tuple[str, ...]
    labels: dict[str, dict[str, dict[str, Any]]]
    history: list[Session] = field(default_factory=list)
    memory_store: str | None = None  # the store of the memory condition (None: no memory condition)
    user: str | None = None  # second part of the namespace (the dialogue's user, as `dualmem eval` wrote it)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "subject"


def _subjects(spec: PersonalitySpec, labels_file: Path | None, out: Path) -> list[Subject]:
    extra = ic.load_labels(labels_file, spec.label_source) if labels_file else {}
    wanted = set(spec.personas)
    subjects: list[Subject] = []
    if spec.mode == "incharacter":
        folder = Path(spec.source)
        labels = ic.load_labels(folder / "characters_labels.json", spec.label_source)
        for c in ic.load_characters(folder):
            persona = Persona(id=c.code, name=c.name, description=f"{c.name} (also known as {', '.join(c.aliases)})")
            subjects.append(
                Subject(
                    c.code, persona, (*c.aliases, c.experimenter), {**labels.get(c.code, {}), **extra.get(c.code, {})}
                )
            )
    else:
        if spec.mode == "run":  # the memory that evaluation ingested, where it put it
            run = spec_of(spec.source)
            items = load_dataset(run.dataset_kind, run.path).items
            base = run_store(settings_of(run), Path(spec.source))
        else:
            items = load_dataset(spec.dataset_kind, spec.source).items
            base = str(out / "lancedb")
        for item in items:
            persona = item.dialogue.persona or Persona(id=item.dialogue.id, name=item.dialogue.id)
            history = item.dialogue.sessions[: spec.sessions] if spec.mode == "dataset" else []
            labels = {**ic.normalise_labels(persona.personality), **extra.get(item.dialogue.id, {})}
            subjects.append(
                Subject(
                    item.dialogue.id,
                    persona,
                    (persona.name, persona.id),
                    labels,
                    history,
                    persona_store(base, item),
                    item.dialogue.user_id or None,
                )
            )
    missing = wanted - {s.id for s in subjects}
    if missing:
        raise ConfigurationError(
            f"--personas {sorted(missing)} are not in {spec.source}; available: {[s.id for s in subjects][:10]}"
        )
    return [s for s in subjects if not wanted or s.id in wanted]


def _mode(source: Path) -> str:
    if (source / "characters.json").exists():
        return "incharacter"
    if read_run(source) is not None:
        return "run"
    return "dataset"


def run_personality(
    source: str | Path,
    *,
    dataset_kind: str = "rolememo",
    framework: str | None = None,
    settings: Settings | dict[str, Any] | None = None,
    questionnaires: str | Sequence[str] = "bfi,mbti",
    labels: str | Path | None = None,
    sessions: int | None = None,
    personas: Sequence[str] | None = None,
    out: str | Path | None = None,
    model: Any = None,
    judge: Any = None,
    embeddings: Any = None,
    label_source: str = "annotation",
    progress: bool = True,
) -> Path:
    """Interview each subject's agent with and without memory, rate it with the judge model, score fidelity; return the folder."""
    settings = Settings.resolve(settings)
    source = Path(source).expanduser().resolve()
    if not source.exists():
        raise ConfigurationError(
            f"{source} does not exist: pass a dataset, a `dualmem eval` run folder or the InCharacter folder"
        )
    mode = _mode(source)
    if mode == "run":  # the run's framework and settings; where and how to run, and the judge, from this call
        run = spec_of(source)
        values = settings.flat()
        here = {k: values[k] for k in OPERATIONAL if k not in ("store_uri", "openai_api_key") and k in values}
        framework = run.framework
        settings = settings_of(
            run, **here, **({"judge_model": settings.evaluation.judge_model} if settings.evaluation.judge_model else {})
        )
    framework = framework or settings.evaluation.framework
    names = [
        ic.questionnaire_name(q)
        for q in (questionnaires.split(",") if isinstance(questionnaires, str) else questionnaires)
        if q.strip()
    ]
    data_dir = source if mode == "incharacter" else Path(settings.evaluation.incharacter_dir).expanduser()
    tests = [ic.load_questionnaire(data_dir, n) for n in names]
    chat = load_chat_model(model, settings)
    rater = load_chat_model(judge, settings, role="judge")
    spec = PersonalitySpec(
        source=str(source),
        mode=mode,
        dataset_kind=dataset_kind,
        framework=framework,
        questionnaires=names,
        sessions=sessions,
        personas=sorted(personas or []),
        chat_model=model_name(chat),
        judge_model=model_name(rater),
        label_source=label_source,
        labels_file=str(labels) if labels else None,
        settings=recorded_settings(settings),
        stamp=data_stamp(source) if mode != "run" else "",
    )
    run_dir = Path(out) if out else Path("runs") / f"personality-{_safe(source.stem)}-{framework}-{fingerprint(spec)}"
    claim(run_dir, spec, resume_hint=False)
    subjects = _subjects(spec, Path(labels) if labels else None, run_dir)
    conditions = ["no-memory"] if mode == "incharacter" else ["memory", "no-memory"]
    journal = Journal(run_dir / JOURNAL)

    def open_condition(subject: Subject, condition: str) -> MemoryFramework:
        store = subject.memory_store if condition == "memory" else str(run_dir / "no-memory" / _safe(subject.id))
        return open_framework(
            framework,
            FrameworkContext(
                namespace=(subject.id, subject.user or settings.user),
                settings=settings,
                persona=subject.persona,
                chat_model=chat,
                embeddings=embeddings,
                store_uri=store,
            ),
        )

    console = Console(stderr=True)
    results: dict[str, dict[str, Any]] = {s.id: {"labels": s.labels, "conditions": {}} for s in subjects}
    try:
        with progress_bars(console, enabled=progress) as (bar, advance):
            asked = bar.add_task(
                "interview answers", total=len(subjects) * len(conditions) * sum(len(t.items) for t in tests)
            )
            rated = bar.add_task(
                "ratings",
                total=len(subjects)
                * len(conditions)
                * sum(len(ic.split_batches(t.items_of(d))) for t in tests for d in t.dimensions),
            )
            ingested = (
                bar.add_task("sessions ingested", total=sum(len(s.history) for s in subjects))
                if mode == "dataset"
                else None
            )

            def test(subject: Subject, condition: str) -> None:
                scope = journal.scope(subject.id)
                agent = open_condition(subject, condition)
                if condition == "memory" and subject.history:
                    log: list[dict[str, Any]] = []
                    opts = RunOptions(
                        journal=scope, on_ingest=(lambda _s: advance(ingested)) if ingested is not None else None
                    )
                    for session in subject.history:
                        ingest_sessions(agent, [session], opts, log)
                    results[subject.id]["ingest"] = log
                for t in tests:
                    answers = interview(
                        agent, t, condition, scope, k=settings.tuning.retrieval_k, on_answer=lambda: advance(asked)
                    )
                    results[subject.id]["conditions"].setdefault(condition, {})[t.name] = assess(
                        rater,
                        t,
                        answers,
                        condition,
                        scope,
                        names=subject.names,
                        retries=settings.tuning.max_retries,
                        on_rating=lambda: advance(rated),
                    )

            _parallel(
                [functools.partial(test, s, c) for s in subjects for c in conditions], settings.evaluation.concurrency
            )
        report = _report(spec, subjects, tests, conditions, results)
        (run_dir / RESULTS).write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str), encoding="utf-8")
        with (run_dir / INTERVIEWS).open("w", encoding="utf-8") as fh:
            for subject_id, key, value in journal.items("interview"):
                condition, qname, item = key.split("/", 2)
                fh.write(
                    json.dumps(
                        {"subject": subject_id, "condition": condition, "questionnaire": qname, "item": item, **value},
                        ensure_ascii=False,
                    )
                    + "\n"
                )
        (run_dir / REPORT).write_text(render_markdown(report), encoding="utf-8")
    finally:
        journal.close()
    console.print(f"wrote {run_dir / RESULTS}, {INTERVIEWS}, {REPORT}")
    return run_dir


def _parallel(jobs: list[Callable[[], None]], workers: int) -> None:
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()  # the first failure is raised (the journal keeps everything finished)


def _report(
    spec: PersonalitySpec,
    subjects: list[Subject],
    tests: list[ic.Questionnaire],
    conditions: list[str],
    results: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    fidelity: dict[str, dict[str, Any]] = {}
    agreement: dict[str, Any] = {}
    for t in tests:
        labels = {s.id: s.labels.get(t.name, {}) for s in subjects if s.labels.get(t.name)}
        scores = {
            c: {s: {d: r["score"] for d, r in res["conditions"][c][t.name].items()} for s, res in results.items()}
            for c in conditions
        }
        for c in conditions:
            fidelity.setdefault(c, {})[t.name] = ic.fidelity(scores[c], labels, t.scale) if labels else None
        if len(conditions) == 2:
            agreement[t.name] = ic.agreement(scores["memory"], scores["no-memory"], t.scale)
    return {
        "meta": {k: v for k, v in vars(spec).items() if k != "settings"}
        | {"settings": spec.settings, "conditions": conditions},
        "fidelity": fidelity,
        "agreement": agreement,
        "subjects": results,
    }


def render_markdown(report: dict[str, Any]) -> str:
    """Return ``personality.md``: fidelity per condition and questionnaire, agreement of the conditions, per-subject types."""
    meta = report["meta"]
    parts = [
        f"# Personality fidelity (InCharacter) — {meta['framework']} on {Path(meta['source']).name}",
        "",
        f"- agent model: `{meta['chat_model']}`; judge model: `{meta['judge_model']}`; labels: `{meta['label_source']}`",
        f"- conditions: {', '.join(meta['conditions'])}; questionnaires: {', '.join(meta['questionnaires'])}",
        "",
    ]
    rows = [
        [
            c,
            q,
            f.get("acc_dim"),
            f.get("acc_full"),
            f.get("mae"),
            f.get("mse"),
            f.get("n_dimensions"),
            f.get("n_subjects"),
        ]
        for c, per in report["fidelity"].items()
        for q, f in per.items()
        if f
    ]
    parts += ["## Fidelity to the labels", ""]
    parts += [
        md_table(["condition", "questionnaire", "Acc_dim", "Acc_full", "MAE", "MSE", "dimensions", "subjects"], rows)
        if rows
        else "(no subject has labels: pass --labels or add `personality` to the persona files)",
        "",
    ]
    if report["agreement"]:
        parts += [
            "## Memory vs no memory",
            "",
            md_table(
                ["questionnaire", "same type", "mean |diff| (0-1)", "dimensions"],
                [[q, a["same_type"], a["mean_abs_diff"], a["n_dimensions"]] for q, a in report["agreement"].items()],
            ),
            "",
        ]
    parts += ["## Per subject", ""]
    table = []
    for sid, res in report["subjects"].items():
        for c, per in res["conditions"].items():
            for q, dims in per.items():
                label = res["labels"].get(q, {})
                cells = " ".join(
                    f"{d}={fmt(r['score'])}{r['type'] or '?'}{'/' + label[d]['type'] if d in label else ''}"
                    for d, r in dims.items()
                )
                table.append([sid, c, q, cells])
    parts += [md_table(["subject", "condition", "questionnaire", "dimension=score type / label"], table), ""]
    return "\n".join(parts)
