"""Pure checks of generated data: fragment difficulty, safety patterns, time firewall.

Every function here is deterministic and model-free (an embedder is optional),
with thresholds as parameters, so the graphs and the tests share one core.

>>> units("I work night shifts at the warehouse")
['work', 'night', 'shift', 'warehouse']
>>> fragment_overlap("I work night shifts", "Been on night shift work all month")
1.0
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.embeddings import Embeddings

from dualmem.vectors import cosine

STOPWORDS = frozenset(
    """a an the and or but if of to in on at by for with from as is am are was were be been being do does did
    have has had i me my mine we our you your he him his she her it its they them their this that these those
    there here so very just really quite too also not no yes oh ok okay well then than about into over up down out
    off some any all can could would should will shall may might must what which who whom when where why how
    lately recently usually sometimes again still yeah kind sort bit lot get got""".split()
)
CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
_CJK_RUN = re.compile(f"[{CJK}]+")
_WORD = re.compile(rf"[^\W{CJK}]+", re.UNICODE)
_SENTENCE = re.compile(r"(?<=[.!?。！？；;])\s*")


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def units(text: str, *, ngram: int = 2) -> list[str]:
    """Return the content units of ``text``: stemmed non-stop words, and character n-grams of CJK runs."""
    lowered = text.lower()
    out = [_stem(w) for w in _WORD.findall(lowered) if w not in STOPWORDS and len(w) > 1]
    for run in _CJK_RUN.findall(lowered):
        out.extend([run] if len(run) < ngram else [run[i : i + ngram] for i in range(len(run) - ngram + 1)])
    return list(dict.fromkeys(out))


def fragment_overlap(fragment: str, text: str, *, ngram: int = 2) -> float:
    """Return the share of the fragment's content units found in ``text`` (0..1)."""
    frag = units(fragment, ngram=ngram)
    if not frag:
        return 0.0
    have = set(units(text, ngram=ngram))
    return sum(1 for u in frag if u in have) / len(frag)


def sentences(text: str) -> list[str]:
    """Split ``text`` into sentences (Latin and CJK punctuation)."""
    return [s for s in _SENTENCE.split(text) if s.strip()] or [text]


@dataclass
class FragmentHit:
    """How strongly one turn carries one fragment."""

    turn_index: int
    role: str
    overlap: float
    similarity: float | None

    def present(self, overlap_threshold: float, similarity_threshold: float) -> bool:
        """Return True when the turn carries the fragment (lexically or by meaning)."""
        return self.overlap >= overlap_threshold or (
            self.similarity is not None and self.similarity >= similarity_threshold
        )


@dataclass
class DifficultyResult:
    """The outcome of the difficulty check: ``ok`` or the reasons it failed."""

    ok: bool
    reasons: list[str] = field(default_factory=list)
    fragment_turns: list[int | None] = field(default_factory=list)
    scores: list[list[dict[str, Any]]] = field(default_factory=list)


def _similarities(
    fragments: Sequence[str], texts: Sequence[str], embeddings: Embeddings | None
) -> list[list[float | None]]:
    """Return, per fragment and turn, the best cosine between the fragment and a sentence of the turn."""
    if embeddings is None:
        return [[None] * len(texts) for _ in fragments]
    pieces = [sentences(t) for t in texts]
    flat = [s for p in pieces for s in p]
    vecs = embeddings.embed_documents(list(fragments) + flat)
    frag_vecs, sent_vecs = vecs[: len(fragments)], vecs[len(fragments) :]
    out: list[list[float | None]] = []
    for fv in frag_vecs:
        row: list[float | None] = []
        pos = 0
        for p in pieces:
            row.append(max(cosine(fv, sv) for sv in sent_vecs[pos : pos + len(p)]))
            pos += len(p)
        out.append(row)
    return out


def difficulty_check(
    turns: Sequence[dict[str, Any]],
    fragments: Sequence[str],
    *,
    embeddings: Embeddings | None = None,
    overlap_threshold: float = 0.6,
    similarity_threshold: float = 0.6,
    echo_overlap_threshold: float | None = None,
    echo_similarity_threshold: float | None = None,
    ngram: int = 2,
) -> DifficultyResult:
    """Check that each fragment occurs in exactly one user turn and no assistant turn echoes it.

    ``turns`` are ``{"role", "text"}`` dicts. A turn carries a fragment when the
    share of the fragment's content units it contains reaches
    ``overlap_threshold`` or (with ``embeddings``) a sentence of it reaches
    ``similarity_threshold`` cosine — so paraphrases count; CJK text is compared
    by character ``ngram``-grams. Echo thresholds default to the same values.
    """
    echo_o = overlap_threshold if echo_overlap_threshold is None else echo_overlap_threshold
    echo_s = similarity_threshold if echo_similarity_threshold is None else echo_similarity_threshold
    texts = [str(t.get("text") or t.get("content") or "") for t in turns]
    sims = _similarities(fragments, texts, embeddings)
    result = DifficultyResult(ok=True)
    for f_i, fragment in enumerate(fragments):
        hits = [
            FragmentHit(
                i, str(turns[i].get("role", "")), fragment_overlap(fragment, texts[i], ngram=ngram), sims[f_i][i]
            )
            for i in range(len(turns))
        ]
        users = [h for h in hits if h.role == "user" and h.present(overlap_threshold, similarity_threshold)]
        echoes = [h for h in hits if h.role == "assistant" and h.present(echo_o, echo_s)]
        label = f"fragment {f_i + 1} ({fragment[:60]!r})"
        if not users:
            result.reasons.append(f"{label} occurs in no user turn")
        elif len(users) > 1:
            result.reasons.append(
                f"{label} occurs in {len(users)} user turns {[h.turn_index for h in users]}, expected exactly one"
            )
        if echoes:
            result.reasons.append(f"{label} is echoed by the agent in turns {[h.turn_index for h in echoes]}")
        result.fragment_turns.append(users[0].turn_index if len(users) == 1 else None)
        result.scores.append(
            [
                {"turn": h.turn_index, "role": h.role, "overlap": round(h.overlap, 3), "similarity": h.similarity}
                for h in hits
                if h.overlap > 0
            ]
        )
    if (
        len(fragments) == 2
        and None not in result.fragment_turns
        and result.fragment_turns[0] == result.fragment_turns[1]
    ):
        result.reasons.append("both fragments sit in the same user turn; they must come up separately")
    result.ok = not result.reasons
    return result


# --------------------------------------------------------------------------- safety

SAFETY_PATTERNS: dict[str, re.Pattern[str]] = {
    "email": re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+"),
    "phone": re.compile(
        r"(?<!\w)(?:\+?\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?)?\d{3,4}[\s.-]\d{3,4}(?:[\s.-]\d{2,4})?(?!\w)|(?<!\d)1[3-9]\d{9}(?!\d)"
    ),
    "id_number": re.compile(r"(?<!\d)(?:\d{3}-\d{2}-\d{4}|\d{17}[\dXx]|(?:\d{4}[ -]?){3}\d{1,7})(?!\d)"),
    "violence": re.compile(
        r"\b(?:kill(?:ed|ing|s)?|murder\w*|stab\w*|shoot(?:ing)?|shot him|shot her|bomb\w*|explosive\w*|"
        r"gun\w*|weapon\w*|suicide|self-harm|behead\w*|torture\w*|massacre\w*)\b|杀|炸弹|枪|自杀|砍",
        re.I,
    ),
}


def safety_flags(text: str, patterns: dict[str, re.Pattern[str]] | None = None) -> list[dict[str, str]]:
    """Return the pattern hits of ``text``: ``[{"kind", "match"}]`` (empty = nothing flagged)."""
    hits = []
    for kind, pattern in (patterns or SAFETY_PATTERNS).items():
        for match in pattern.finditer(text):
            hits.append({"kind": kind, "match": match.group(0)})
    return hits


def flag_turns(
    turns: Sequence[dict[str, Any]], patterns: dict[str, re.Pattern[str]] | None = None
) -> list[dict[str, Any]]:
    """Return ``[{"turn", "role", "text", "flags"}]`` for every turn the pattern pass flags."""
    out = []
    for i, turn in enumerate(turns):
        text = str(turn.get("text") or turn.get("content") or "")
        flags = safety_flags(text, patterns)
        if flags:
            out.append({"turn": i, "role": turn.get("role", ""), "text": text, "flags": flags})
    return out


# --------------------------------------------------------------------------- time firewall


def mentions_future(
    text: str,
    future_events: Sequence[str],
    known: Sequence[str] = (),
    *,
    threshold: float = 0.5,
    ngram: int = 2,
) -> str | None:
    """Return the later event ``text`` leaks (its units unknown from ``known`` yet found in text), else None.

    Only the units of an event that appear in no past or current event count,
    so shared everyday words do not trip the check.
    """
    seen = {u for k in known for u in units(k, ngram=ngram)}
    have = set(units(text, ngram=ngram))
    for event in future_events:
        novel = [u for u in units(event, ngram=ngram) if u not in seen]
        if novel and sum(1 for u in novel if u in have) / len(novel) >= threshold:
            return event
    return None
