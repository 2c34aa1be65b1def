"""MkDocs hooks: pages whose figures and tables come from the code and the results files, at build time.

A page holds a marker; the build replaces it:

- the memory browser's screenshots (``guides/img/browser-*.png``) are made from the bundled sample
  (:mod:`screenshots`), never committed;
- ``<!-- settings-table -->`` — every setting of :mod:`dualmem.config` (name, environment variable, default, help);
- ``<!-- bench: NAME -->`` — the figures of ``benchmarks/results/NAME.json``, rendered by ``render_NAME`` below, each
  table followed by the command that produced it (the results file's ``command``).

No figure is typed into a page by hand; a marker naming a file that is absent, or a file without its command,
fails the build.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MARKER = re.compile(r"<!-- bench: ([a-z0-9_]+) -->")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(stats: dict[str, Any]) -> str:
    return f"{stats['p50_ms']:g} / {stats['p95_ms']:g}"


def render_store_bench(d: dict[str, Any]) -> str:
    """The retrieval paths of one persona inside the large shared table, and the load test."""
    rows = [[name, _ms(s), s["n"]] for name, s in d["latency"].items()]
    out = [
        f"{d['rows']:,} rows in {d['namespaces']} namespaces of {d['ns_items']:,} items; p50 / p95 in ms.",
        "",
        _table(["path", "p50 / p95 ms", "queries"], rows),
        "",
        f"Warm ranker / numpy p50: **{d['ratio_ranker_warm_to_numpy_p50']}×**; vector candidates / numpy: "
        f"**{d['ratio_candidates_warm_to_numpy_p50']}×** (target ≤ {d['targets']['ranker_warm_to_numpy_p50_max']}×); "
        f"a fresh worker's first search: **{d['fresh_worker_first_search_p50_ms']} ms** p50 "
        f"(target ≤ {d['targets']['fresh_worker_first_search_p50_ms_max']} ms).",
    ]
    load = d.get("load_test")
    if load:
        out += [
            "",
            f"Load test: 1 writer and {load['reader_processes']} reader processes for {load['seconds']:g} s.",
            "",
            _table(
                ["errors", "stale reads", "commits seen", "staleness p50 / p95 / max ms", "reads/s", "writes/s"],
                [
                    [
                        load["errors"],
                        load["stale_reads"],
                        load["commits_seen"],
                        f"{load['staleness_p50_ms']} / {load['staleness_p95_ms']} / {load['staleness_max_ms']}",
                        load["reads_per_s"],
                        load["writes_per_s"],
                    ]
                ],
            ),
        ]
    return "\n".join(out)


def render_chat_latency(d: dict[str, Any]) -> str:
    """Time to first token of a create_agent reply with the middleware on and off."""
    rows = [[mode, _ms(m["ttft_off"]), _ms(m["ttft_on"]), _ms(m["ttft_added"])] for mode, m in d["modes"].items()]
    return "\n".join(
        [
            f"Persona {d['persona']} ({d['namespace_items']['facts']:,} facts, {d['namespace_items']['insights']:,} insights), "
            f"a model answering after {d['model']['ttft_s']} s; {d['queries']} queries; p50 / p95 in ms.",
            "",
            _table(["agent", "TTFT off", "TTFT on", "added by memory"], rows),
            "",
            f"Retrieval alone: {_ms(d['retrieval_alone'])} ms back to back, {_ms(d['retrieval_after_idle'])} ms as a "
            "chat turn meets it, in a worker thread after the model's wait "
            f"(target: memory adds ≤ {d['target']['ttft_added_p50_ms']:g} ms p50).",
        ]
    )


def render_writer_overhead(d: dict[str, Any]) -> str:
    """The writer's time per chunk outside the model call."""
    per = d["per_chunk_ms"]
    return "\n".join(
        [
            f"{d['chunks']} chunks of RealMem {d['persona']} (first {d['sessions']} sessions), {d['items_written']} items written.",
            "",
            _table(
                [
                    "per chunk p50 ms",
                    "p95 ms",
                    "mean ms",
                    "of which the embedder, p50 ms",
                    "outside the embedder, p50 ms",
                    "target p50 ms",
                    "table commits per chunk",
                    "files per chunk",
                ],
                [
                    [
                        per["p50"],
                        per["p95"],
                        per["mean"],
                        d.get("embedder_ms_per_chunk_p50") or "—",
                        (d.get("outside_embedder_ms_per_chunk") or {}).get("p50", "—"),
                        d["target"]["per_chunk_p50_ms_max"],
                        d.get("commits_per_chunk", "—"),
                        d.get("files_per_chunk", "—"),
                    ]
                ],
            ),
        ]
    )


def render_growth(d: dict[str, Any]) -> str:
    """Costs along one long history: the writer per chunk, a fresh worker's first search, files and versions."""
    out = []
    for run in d["runs"]:
        place = "a local folder" if run["place"] == "local" else "an S3-compatible server (moto, loopback)"
        at = [
            [
                f"{a['chunk']:,}",
                a["overhead_ms_p50"],
                a.get("embedder_ms_p50", "—"),
                a["commits_per_chunk"],
                "—" if a["requests_per_chunk"] is None else a["requests_per_chunk"],
            ]
            for a in run["at"]
        ]
        points = [
            [
                f"{p['chunks_written']:,}",
                f"{p['items']:,}",
                f"{p['files']:,}",
                f"{p['bytes'] / 1e6:.1f}",
                p["memory_versions"],
                f"{p['fresh_first_search']['ms']:g} ({p['fresh_first_search']['of_which_query_embedding_ms']:g})"
                if "fresh_first_search" in p
                else "—",
            ]
            for p in run["points"]
        ]
        machine = run.get("machine") or d["machine"]
        out += [
            f"**{place}**: {run['chunks']:,} chunks in {run['wall_s']:g} s "
            f"({machine['cpus']} cores, load {machine['load_avg_1m']})"
            + (f", by `{run['command']}`." if run.get("command", d["command"]) != d["command"] else "."),
            "",
            _table(
                [
                    "at chunk",
                    "writer overhead p50 ms",
                    "of which the embedder",
                    "table commits per chunk",
                    "S3 requests per chunk",
                ],
                at,
            ),
            "",
            _table(
                [
                    "chunks written",
                    "items",
                    "files",
                    "MB",
                    "memory table versions",
                    "fresh worker's first search ms (of which the query's embedding)",
                ],
                points,
            ),
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def _verdict(runs: list[dict[str, Any]], key: str, target: float) -> str:
    below = [f"{r['mode']} at limit {r['limit']}: {r[key]}" for r in runs if r[key] < target]
    return f"**not met** ({'; '.join(below)})" if below else "**met**"


def render_eval_scale(d: dict[str, Any]) -> str:
    """`dualmem eval` of many small personas against a slow endpoint, in threads of one process and on a Ray cluster."""
    t, runs, g = d["targets"], d["runs"], d["driver_rss_growth"]
    rows = [
        [
            r["mode"],
            r["personas"],
            r["limit"],
            r["units_in_flight"],
            r["calls"],
            r["calls_per_s"],
            r["utilisation"],
            f"{r['bound_fraction']} ({r['bound_fraction_of_free_cores']})",
            r["cpu_s_per_call"],
            f"{r['driver_peak_rss_mb']:g} / {r['worker_peak_rss_mb'] or '–'}",
            r["query_errors"] + r["failed_chunks"],
        ]
        for r in runs
    ]
    return "\n".join(
        [
            f"Every model call answered after {d['latency_s']:g} s; {d['machine']['cpus']} CPU cores.",
            "",
            _table(
                [
                    "mode",
                    "personas",
                    "endpoint limit",
                    "units in flight",
                    "calls",
                    "calls/s",
                    "utilisation",
                    "bound fraction (of free cores)",
                    "CPU-s per call",
                    "peak RSS MB driver / worker",
                    "errors",
                ],
                rows,
            ),
            "",
            f"Targets: utilisation ≥ {t['utilisation_at_16']} at limit 16, "
            f"{_verdict([r for r in runs if r['limit'] == 16], 'utilisation', t['utilisation_at_16'])}; "
            f"bound fraction ≥ {t['bound_fraction']} in every run, {_verdict(runs, 'bound_fraction', t['bound_fraction'])}. "
            f"The driver's peak memory from {g['personas'][0]} to {g['personas'][1]} personas on Ray: "
            f"{g['driver_peak_rss_mb'][0]:g} → {g['driver_peak_rss_mb'][1]:g} MB (×{g['ratio']:g}).",
        ]
    )


def render_eval_cost(d: dict[str, Any]) -> str:
    """Tokens and calls per phase of every framework on the bundled sample."""
    phases = ("writing", "retrieval", "answering", "judging")
    rows = [
        [
            name,
            f"{r['tokens_per_query']:,.0f}",
            r["calls_per_query"],
            *(
                f"{r['phases'][p]['calls']} / {r['phases'][p]['input_tokens'] + r['phases'][p]['output_tokens']:,}"
                for p in phases
            ),
            "–" if not r["writer_input_per_history_token"] else f"{r['writer_input_per_history_token']:g}×",
        ]
        for name, r in sorted(d["frameworks"].items(), key=lambda kv: kv[1]["tokens_per_query"])
    ]
    log = d["endpoint_log"]
    return "\n".join(
        [
            f"{d['dataset']}; {d['endpoint']}; judge repetitions {d['settings']['judge_repetitions']}, embedder "
            f"{d['settings']['embedder']}. Cheapest first.",
            "",
            _table(
                [
                    "framework",
                    "tokens per query",
                    "calls per query",
                    *(f"{p} calls / tokens" for p in phases),
                    "writer input per history token",
                ],
                rows,
            ),
            "",
            f"The summaries' totals {'agree' if d['agrees_with_endpoint'] else 'do **not** agree'} with the endpoint's own log: "
            f"{log['calls']} calls, {log['input_tokens']:,} input and {log['output_tokens']:,} output tokens ({d['seconds']:g} s).",
        ]
    )


def _grpo_curve_row(c: dict[str, Any]) -> list[Any]:
    return [
        c["phase"],
        c["step"],
        f"{c['score']:+.4f} ± {c['score_se']:.4f}",
        c["parsed_share"],
        c["fact_recall"],
        c["insight_recall"],
    ]


def _paired(d: dict[str, Any]) -> str:
    p = d["paired_check"]
    return (
        f"final − initial at {len(p['seeds'])} other evaluation seeds: {', '.join(f'{x:+}' for x in p['final_minus_initial'])} "
        f"(mean **{p['mean_gain']:+}**); the initial model's own spread over seeds: sd {p['noise_initial_sd']}, "
        f"range {p['noise_initial_range']}"
    )


def render_grpo_tiny_cpu(d: dict[str, Any]) -> str:
    """Held-out reward of a tiny random Llama: random init, after a short SFT, then every few GRPO steps (TRL, CPU)."""
    s, sec = d["settings"], d["seconds"]
    return "\n".join(
        [
            f"{s['train_personas']} training histories, held out: {', '.join(d['heldout_history'])}. SFT {s['sft_steps']} steps "
            f"(final loss {d['sft_final_loss']}), then GRPO {s['grpo_steps']} steps of {s['num_generations']} rollouts, "
            f"learning rate {s['lr']:g}. Held-out reward: the mean episode reward of {s['eval_rollouts']} rollouts "
            f"(± its standard error), the same evaluation seed at every point.",
            "",
            _table(
                ["phase", "step", "held-out reward", "parsed share", "fact recall", "insight recall"],
                [_grpo_curve_row(c) for c in d["heldout_curve"]],
            ),
            "",
            f"Paired check, {_paired(d)}. Time: {sec['total']:g} s ({sec['sft']:g} s SFT, {sec['grpo_incl_evals']:g} s GRPO "
            f"with its evaluations).",
        ]
    )


def _grpo_summary(d: dict[str, Any]) -> str:
    s, curve = d["settings"], d["heldout_curve"]
    start = next(c for c in curve if c["phase"] == "after SFT")
    return "\n".join(
        [
            _table(
                ["GRPO seed", "rewards", "held-out reward after SFT → last step", "parsed share"],
                [
                    [
                        s["grpo_seed"],
                        "shuffled within each group" if s["placebo"] else "as earned",
                        f"{start['score']:+.4f} → {curve[-1]['score']:+.4f} (step {curve[-1]['step']})",
                        f"{start['parsed_share']} → {curve[-1]['parsed_share']}",
                    ]
                ],
            ),
            "",
            f"Paired check, {_paired(d)}.",
        ]
    )


render_grpo_tiny_cpu_seed7 = render_grpo_tiny_cpu_placebo = _grpo_summary


def render_verl_gpu_h100(d: dict[str, Any]) -> str:
    """VeRL GRPO of the same tiny writer on one GPU: the held-out reward before and during training."""
    s, p, steps = d["settings"], d["prepared"], d["train_steps"]
    key = "dualmem/rolememo-writer/{}/{}@" + str(s["val_n"])
    val = [
        [
            v["step"],
            f"{v[key.format('reward', 'mean')]:+.4f} ± {v[key.format('reward', 'std')]:.4f}",
            *(round(v[key.format(k, "mean")], 4) for k in ("parsed_share", "fact_recall", "penalty")),
        ]
        for v in d["validation"]
    ]
    train = [
        [
            t["step"],
            f"{t['critic/score/mean']:+.4f} ({t['critic/score/min']:+.4f} … {t['critic/score/max']:+.4f})",
            f"{t['response_length/mean']:.1f}",
            f"{t['timing_s/step']:.1f} ({t['timing_s/gen']:.1f} / {t['timing_s/update_actor']:.1f})",
        ]
        for t in steps
    ]
    stopped = (
        f"The run was stopped at its time limit ({d['seconds']:g} s) after {len(steps)} of {s['total_training_steps']} "
        "planned steps; the validations shown had completed."
        if d["returncode"] == 124
        else f"Exit code {d['returncode']} after {d['seconds']:g} s."
    )
    return "\n".join(
        [
            f"{d['device']}; VeRL {d['versions']['verl']}, transformers rollout (`rollout.name=hf`). The policy: the tiny Llama "
            f"after {p['sft_steps']} SFT steps (final loss {p['sft_final_loss']}); {p['rows']['train']} training rows, "
            f"{p['rows']['val']} held-out rows ({', '.join(p['heldout_histories'])}); {s['rollout_n']} rollouts per prompt, "
            f"learning rate {s['learning_rate']:g}. {stopped}",
            "",
            "Held-out validation, mean ± sd over " + str(s["val_n"]) + " samples:",
            "",
            _table(["after step", "reward", "parsed share", "fact recall", "penalty"], val),
            "",
            "Training steps:",
            "",
            _table(["step", "score mean (min … max)", "response tokens", "step s (generation / actor update)"], train),
        ]
    )


def render_local_engines(d: dict[str, Any]) -> str:
    """The bundled model's throughput and `dualmem demo`'s wall time on each local engine."""
    rows = [
        [
            f"`{name}`",
            f"{e['prompt_tokens_per_s']:g}",
            f"{e['generation_tokens_per_s']:g}",
            f"{e['demo_first_s']:g} / {e['demo_again_s']:g}",
            f"{e['facts']} / {e['insights']} / {e['failed']}",
        ]
        for name, e in d["engines"].items()
    ]
    header = ["engine", "prompt tok/s", "generation tok/s", "demo s (first / again)", "demo facts / insights / failed"]
    missing = f" Not installed: {', '.join(d['not_installed'])}." if d.get("not_installed") else ""
    return f"{_table(header, rows)}\n\nTarget for the demo: ≤ {d['target_demo_s']:g} s.{missing}"


def render_store_serving(d: dict[str, Any]) -> str:
    """The LangGraph server's store path: gathered async calls, plain and batched."""
    rows = [
        [name, r["gathered_500_put_500_get_s"], r["sequential_50_aput_s"]]
        for name, r in d.items()
        if isinstance(r, dict) and "gathered_500_put_500_get_s" in r
    ]
    best = min(r[1] for r in rows)
    verdict = "met" if best <= d["target_gathered_s_max"] else "missed"
    return (
        _table(["store", "500 aput + 500 aget gathered, s", "50 sequential aput, s"], rows)
        + f"\n\nTarget ≤ {d['target_gathered_s_max']:g} s for the gathered calls on the server's store: {verdict} "
        f"({best:g} s); {d['machine']}."
    )


def render_ui_load(d: dict[str, Any]) -> str:
    """The memory browser's page loads per namespace size."""
    pages = ["first page", "tenth page", "item with history", "search"]
    rows = [[f"{r['items']:,}", *(f"{r[p]['p50_ms']:g} / {r[p]['max_ms']:g}" for p in pages)] for r in d["runs"]]
    worst = max(r["first page"]["p50_ms"] for r in d["runs"])
    verdict = "met" if worst <= d["target_first_page_ms_max"] else "missed"
    return (
        _table(["items in the namespace", *(f"{p} p50 / max ms" for p in pages)], rows)
        + f"\n\nA user's first page at every size: at most **{worst:g} ms** p50, target ≤ {d['target_first_page_ms_max']} ms "
        f"({verdict}); {d['machine']}."
    )


def render_rolememo_dry_run(d: dict[str, Any]) -> str:
    """Batch ingest of many synthetic personas on a Ray cluster into S3 or a local folder (no requests to count:
    "—"), and the projection of the full corpus."""
    m, store, per = d["measured"], d["measured"]["store"], d["measured"]["steady_state"]["per_chunk"]
    run = [
        [
            d["setup"]["personas"],
            m["chunks_written"],
            m["wall_s"],
            m["chunks_per_s"],
            per["harness_cpu_s"],
            per["commits"],
            "—" if per["requests"] is None else per["requests"],
            m["driver_peak_rss_mb"],
            f"{m['lease_waits']['histories_that_waited']} ({m['lease_waits']['total_s']:g} s in all, longest "
            f"{m['lease_waits']['longest_s']:g} s)",
            m["lease_timeouts"],
        ]
    ]
    tiers = [
        [
            f"{t['history_tokens'] // 1000}k",
            f"{t['chunks']:,}",
            t["wall_h"],
            t["bound_by"].removesuffix("_s"),
            f"{t['commits']:,}",
            "—" if t["requests"] is None else f"{t['requests']:,}",
        ]
        for t in d["projection"]["tiers"]
    ]
    checks = (
        f"{store['chunks_applied']}/{store['chunks_expected']} chunks applied, "
        f"{store['namespaces_not_exactly_applied']} namespaces not exactly once, "
        f"{store['memory_pk_duplicated']} duplicated rows, {store['lease_rows_still_held']} leases left held"
    )
    inputs = d["projection"]["inputs"]
    return "\n".join(
        [
            _table(
                [
                    "personas",
                    "chunks",
                    "wall s",
                    "chunks/s",
                    "harness CPU s per chunk",
                    "commits per chunk",
                    "S3 requests per chunk",
                    "driver peak MB",
                    "histories that waited for a lease",
                    "lease timeouts",
                ],
                run,
            ),
            "",
            f"Checked in the store afterwards: {checks}.",
            "",
            f"Projection of {inputs['P']:,} personas (`{d['projection']['formula']}`; T = {inputs['T_calls_per_s']:g} "
            f"calls/s, {inputs['concurrency']} histories in flight, {inputs['latency_s']:g} s per call, "
            f"{inputs['cores']} cores; per-chunk figures of the steady state above):",
            "",
            _table(["history", "chunks", "wall h", "bound by", "commits", "S3 requests"], tiers),
        ]
    )


render_rolememo_dry_run_folder = render_rolememo_dry_run


def render_bench(name: str) -> str:
    """Return the markdown of one results file (its table and the command that produced it)."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise ValueError(f"docs: benchmark marker {name!r} names {path}, which does not exist")
    data = json.loads(path.read_text())
    render: Callable[[dict[str, Any]], str] | None = globals().get(f"render_{name}")
    if render is None:
        raise ValueError(f"docs: no renderer render_{name} in docs/hooks.py")
    if not data.get("command"):
        raise ValueError(f"docs: {path} records no command; re-run its benchmark")
    return f"{render(data)}\n\nProduced by `{data['command']}` ({path.relative_to(REPO)}).\n"


def settings_table() -> str:
    """Return the tables of every setting, one per object that holds them (deployment, tuning, evaluation), from the
    code."""
    from dualmem.config import EvalOptions, Settings, Tuning, settings_by_object

    titles = {
        "settings": ("Deployment: `Settings`", Settings),
        "tuning": ("Tuning: `Settings.tuning` (`Tuning`)", Tuning),
        "evaluation": ("Evaluation: `Settings.evaluation` (`EvalOptions`)", EvalOptions),
    }
    parts = []
    for group, (title, kind) in titles.items():
        summary = (kind.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        table = _table(
            ["setting", "environment variable", "default", "what it does"],
            [
                [f"`{name}`", f"`{var}`", f"`{default}`", text.replace("|", "\\|")]
                for name, var, default, text in settings_by_object()[group]
            ],
        )
        parts.append(f"### {title}\n\n{summary}\n\n{table}")
    return "\n\n".join(parts)


def on_files(files: Any, config: Any, **_: Any) -> Any:
    """Add the memory browser's screenshots (made now from the bundled sample: docs/screenshots.py) to the site."""
    import sys

    from mkdocs.structure.files import File

    sys.path.insert(0, str(Path(__file__).parent))
    from screenshots import screenshots

    for name, png in screenshots().items():
        files.append(File.generated(config, f"guides/img/{name}", content=png))
    return files


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the page's markers by tables built from the code and the results files."""
    markdown = markdown.replace("<!-- settings-table -->", settings_table())
    return MARKER.sub(lambda m: render_bench(m.group(1)), markdown)
