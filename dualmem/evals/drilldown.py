"""The per-query drill-down of ``report.html``: every query, its gold, what was retrieved (hits marked), the answer, the judges.

Each query is a ``<details class="query">`` block written as plain HTML (the
page reads without JavaScript); a few lines of inline JavaScript filter the
blocks by free text, task type / category, persona, hit or miss in the top-k
and errors. The filter state lives in the URL fragment
(``report.html#group=temporal&hit=0&q=exam``), so a filtered view can be
shared or reopened.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from dualmem.evals.summary import group_label

HIT_K = 10  # a query "hits" when one of its first HIT_K scored items matches gold evidence
HEADLINE_METRIC = {"realmem": "recall_any@10", "locomo": "evidence_recall@10", "rolememo": "fact_recall"}

STYLE = """
#queries .controls{display:flex;flex-wrap:wrap;gap:.5em;align-items:center;position:sticky;top:0;background:#fff;padding:.5em 0;z-index:1}
#queries input[type=search]{min-width:18em}
details.query{border:1px solid #ddd;border-radius:4px;margin:.4em 0;padding:.2em .6em}
details.query>summary{cursor:pointer}
details.query .tag{display:inline-block;background:#eef;border-radius:3px;padding:0 .4em;margin:0 .2em;font-size:90%}
details.query .hit{color:#0a0;font-weight:bold}details.query .miss{color:#b00;font-weight:bold}
details.query table{width:100%}details.query td{text-align:left;vertical-align:top}
details.query tr.hitrow{background:#e9f8e9}details.query tr.expanded{color:#777}
details.query .errors{color:#b00}
"""

SCRIPT = """
(function(){
  var blocks=[].slice.call(document.querySelectorAll('details.query'));
  var q=document.getElementById('f-text'),g=document.getElementById('f-group'),p=document.getElementById('f-persona'),
      h=document.getElementById('f-hit'),e=document.getElementById('f-errors'),n=document.getElementById('q-count');
  function fromHash(){
    var s=new URLSearchParams(location.hash.slice(1));
    q.value=s.get('q')||'';g.value=s.get('group')||'';p.value=s.get('persona')||'';h.value=s.get('hit')||'';
    e.checked=s.get('errors')==='1';
  }
  function apply(){
    var text=q.value.trim().toLowerCase(),shown=0;
    blocks.forEach(function(b){
      var ok=(!text||b.dataset.text.indexOf(text)>=0)&&(!g.value||b.dataset.group===g.value)&&
             (!p.value||b.dataset.persona===p.value)&&(!h.value||b.dataset.hit===h.value)&&(!e.checked||b.dataset.errors==='1');
      b.hidden=!ok;if(ok){shown++;}
    });
    n.textContent='showing '+shown+' of '+blocks.length+' queries';
    var s=new URLSearchParams();
    if(q.value)s.set('q',q.value);if(g.value)s.set('group',g.value);if(p.value)s.set('persona',p.value);
    if(h.value)s.set('hit',h.value);if(e.checked)s.set('errors','1');
    history.replaceState(null,'',s.toString()?'#'+s.toString():location.pathname);
  }
  fromHash();
  [q,g,p,h,e].forEach(function(el){el.addEventListener('input',apply);el.addEventListener('change',apply);});
  window.addEventListener('hashchange',function(){fromHash();apply();});
  apply();
})();
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return _e(value)


def query_hit(record: Mapping[str, Any], k: int = HIT_K) -> bool | None:
    """Return whether one of the first ``k`` scored items matches gold evidence (None when the query has no gold)."""
    gold = record.get("gold") or {}
    if not (gold.get("session_ids") or gold.get("turn_ids") or gold.get("facts") or gold.get("insight")):
        return None
    scored = [r for r in record.get("retrieved", []) if not r.get("expanded")][:k]
    return any(r.get("hit") for r in scored)


def _options(element_id: str, label: str, values: Sequence[str]) -> str:
    opts = "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in values)
    return f'<label>{label} <select id="{element_id}"><option value="">all</option>{opts}</select></label>'


def _gold(record: Mapping[str, Any]) -> str:
    gold = record.get("gold") or {}
    rows = [
        ("reference answer", record.get("reference_answer")),
        ("facts", gold.get("facts")),
        ("insight", gold.get("insight")),
        ("sessions", gold.get("session_ids")),
        ("turns", gold.get("turn_ids")),
        ("memory points", gold.get("memory_points")),
    ]
    out = []
    for name, value in rows:
        if not value:
            continue
        if isinstance(value, list):
            body = (
                "<ol>" + "".join(f"<li>{_e(v)}</li>" for v in value) + "</ol>"
                if name != "sessions" and name != "turns"
                else _e(", ".join(value))
            )
        else:
            body = _e(value)
        out.append(f"<tr><th>{name}</th><td>{body}</td></tr>")
    return "<table class='gold'>" + "".join(out) + "</table>" if out else "<p>(no gold evidence)</p>"


def _retrieved(record: Mapping[str, Any]) -> str:
    rows = []
    for rank, item in enumerate(record.get("retrieved", []), start=1):
        hit = item.get("hit") or []
        mark = f"<span class='hit'>✓ {_e(', '.join(hit))}</span>" if hit else "<span class='miss'>✗</span>"
        cls = "expanded" if item.get("expanded") else ("hitrow" if hit else "")
        where = ", ".join(item.get("sessions") or ([item["session"]] if item.get("session") else []))
        turns = ", ".join(item.get("turn_ids") or [])
        kind = _e(item.get("kind")) + (" (cited by an insight)" if item.get("expanded") else "")
        rows.append(
            f"<tr class='{cls}'><td>{rank}</td><td>{mark}</td><td>{kind}</td><td>{_e(item.get('text'))}</td>"
            f"<td>{_e(where)}{' · ' + _e(turns) if turns else ''}</td><td>{_fmt(item.get('score'))}</td></tr>"
        )
    if not rows:
        return "<p>(nothing retrieved)</p>"
    return (
        "<table class='retrieved'><tr><th>#</th><th>hit</th><th>kind</th><th>text</th><th>source</th><th>score</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _judges(record: Mapping[str, Any]) -> str:
    judges = record.get("judges") or {}
    if not judges:
        return ""
    rows = "".join(
        f"<tr><td>{_e(k)}</td><td>{_fmt(v.get('score'))}</td><td>{_e(v.get('comment'))}</td></tr>"
        for k, v in judges.items()
    )
    return f"<h4>Judges</h4><table class='judges'><tr><th>judge</th><th>score</th><th>comment</th></tr>{rows}</table>"


def _metrics(record: Mapping[str, Any]) -> str:
    values = {
        k: v
        for k, v in (record.get("metrics") or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    return " ".join(f"<span class='tag'>{_e(k)} {_fmt(v)}</span>" for k, v in values.items())


def render_query(record: Mapping[str, Any]) -> str:
    """Return one query's ``<details>`` block."""
    group = group_label(record) or "(none)"
    hit = query_hit(record)
    hit_attr = "" if hit is None else ("1" if hit else "0")
    mark = "" if hit is None else ("<span class='hit'>hit</span>" if hit else "<span class='miss'>miss</span>")
    headline = HEADLINE_METRIC.get(str(record.get("protocol")), "")
    value = (record.get("metrics") or {}).get(headline)
    judges = " ".join(
        f"<span class='tag'>{_e(k)} {_fmt(v.get('score'))}</span>" for k, v in (record.get("judges") or {}).items()
    )
    errors = record.get("errors") or []
    texts = [
        record.get("query"),
        record.get("answer"),
        record.get("reference_answer"),
        record.get("persona"),
        record.get("query_id"),
        *((record.get("gold") or {}).get("facts") or []),
        (record.get("gold") or {}).get("insight"),
        *((record.get("gold") or {}).get("memory_points") or []),
        *(r.get("text") for r in record.get("retrieved", [])),
    ]
    search = " ".join(str(t) for t in texts if t).lower()
    answer = f"<h4>Answer</h4><p>{_e(record['answer'])}</p>" if record.get("answer") is not None else ""
    error_html = (
        ("<h4>Errors</h4><ul class='errors'>" + "".join(f"<li>{_e(x)}</li>" for x in errors) + "</ul>")
        if errors
        else ""
    )
    return (
        f'<details class="query" data-persona="{_e(record.get("persona"))}" data-group="{_e(group)}" data-hit="{hit_attr}" '
        f'data-errors="{"1" if errors else "0"}" data-text="{_e(search)}">'
        f"<summary>{mark} <b>{_e(record.get('persona'))} · {_e(record.get('query_id'))}</b> <span class='tag'>{_e(group)}</span>"
        f"{f' {headline} {_fmt(value)}' if value is not None else ''} {judges} {_e(str(record.get('query', ''))[:140])}</summary>"
        f"<h4>Question</h4><p>{_e(record.get('query'))}</p><h4>Gold</h4>{_gold(record)}"
        f"<h4>Retrieved (top {len(record.get('retrieved', []))}; ✓ = matches gold)</h4>{_retrieved(record)}"
        f"{answer}{_judges(record)}<p>{_metrics(record)}</p>{error_html}</details>"
    )


def render_drilldown(records: Sequence[Mapping[str, Any]]) -> str:
    """Return the drill-down section (controls, one block per query, the filter script)."""
    groups = sorted({group_label(r) or "(none)" for r in records})
    personas = sorted({str(r.get("persona")) for r in records})
    controls = (
        '<div class="controls"><input type="search" id="f-text" placeholder="filter: words in question, answer, gold, retrieved">'
        + _options("f-group", "task type / category", groups)
        + _options("f-persona", "persona", personas)
        + '<label>top-10 <select id="f-hit"><option value="">all</option><option value="1">hit</option>'
        '<option value="0">miss</option></select></label>'
        + '<label><input type="checkbox" id="f-errors"> errors only</label> <span id="q-count"></span></div>'
    )
    blocks = "\n".join(render_query(r) for r in records)
    return (
        f'<section id="queries"><h2>Queries ({len(records)})</h2>{controls}{blocks}</section>'
        f"<style>{STYLE}</style><script>{SCRIPT}</script>"
    )
