"""Wrong-but-on-topic and faithful answers, built deterministically from a dataset's gold answers (judge calibration).

From each gold answer (the first ``limit`` of a persona that have one) :func:`candidates` builds:

- faithful answers: the gold answer itself, and a light rewording of it (contractions spelled out, a few synonyms,
  an "As I recall:" opening);
- wrong but on-topic answers: its names swapped for those of the persona's other gold answers (``entity``), its
  numbers, dates, weekdays and months changed (``number``), each sentence negated (``negation``), and the gold answer
  of the persona's next question (``other-answer``); a perturbation that changes nothing is left out.

:mod:`dualmem.evals.calibration` runs the judge on them.

>>> negate("You slept well. It was Monday.")
'You did not sleep well. It was not Monday.'
>>> change_numbers("Three alarms on 7 May 2023")
'Five alarms on 9 August 2024'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dualmem.schema import DatasetItem

WRONG = ("entity", "number", "negation", "other-answer")
FAITHFUL = ("gold", "paraphrase")
NUMBER_WORDS = (
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty thirty forty fifty sixty"
).split()
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = tuple("January February March April May June July August September October November December".split())
NOT_ENTITIES = set(
    "I I'm I'd I've I'll OK Yes No Not The A An It He She They We You My His Her Their Our Your As In On At".split()
)
EXPAND = dict(
    pair.split("=")
    for pair in (
        "don't=do not|doesn't=does not|didn't=did not|isn't=is not|aren't=are not|wasn't=was not|weren't=were not|"
        "can't=cannot|won't=will not|you've=you have|you're=you are|I'm=I am|I've=I have|I'd=I would|that's=that is|"
        "it's=it is|there's=there is|let's=let us|really=truly|maybe=perhaps|think=believe"
    ).split("|")
)
POSITIVE = {"can't": "can", "cannot": "can", "won't": "will"}
AUXILIARY = re.compile(r"\b(is|are|was|were|am|will|would|can|could|should|must|has|have|had|do|does|did)\b")
PAST = dict(  # a verb in the past, negated as "did not" + the verb
    pair.split(":")
    for pair in "slept:sleep went:go said:say told:tell gave:give made:make took:take stopped:stop moved:move "
    "started:start got:get came:come felt:feel".split()
)


def _words(text: str, table: Mapping[str, str]) -> str:
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(table, key=len, reverse=True)) + r")\b", re.I)

    def swap(m: re.Match[str]) -> str:
        word = m.group(0)
        new = table.get(word) or table.get(word.lower()) or word
        return new[0].upper() + new[1:] if word[0].isupper() else new

    return pattern.sub(swap, text)


def paraphrase(text: str) -> str:
    """Return a light rewording of ``text`` that keeps its meaning."""
    return "As I recall: " + _words(text.replace("’", "'"), EXPAND)


def entities(text: str) -> list[str]:
    """Return the names in ``text``: capitalised words not opening a sentence (any, in an answer of five words or fewer)."""
    short, out = len(text.split()) <= 5, []
    for m in re.finditer(r"\b[A-Z][A-Za-z-]+(?:\s+[A-Z][A-Za-z-]+)*", text):
        name, before = m.group(0), text[: m.start()].rstrip()
        if not short and (not before or before[-1] in ".!?:\"'“("):
            name = name.split(None, 1)[1] if " " in name else ""
        if name and name not in NOT_ENTITIES and name not in out:
            out.append(name)
    return out


def swap_entities(text: str, pool: Sequence[str]) -> str | None:
    """Return ``text`` with each of its names replaced by one of ``pool`` (other answers' names), or None."""
    mine = entities(text)
    others = [e for e in pool if e not in mine]
    if not mine or not others:
        return None
    for i, name in enumerate(mine):
        text = re.sub(rf"\b{re.escape(name)}\b", others[i % len(others)], text)
    return text


def _shift(word: str, seq: Sequence[str], by: int) -> str:
    index = [s.lower() for s in seq].index(word.lower())
    new = seq[(index + by) % len(seq)]
    return new.capitalize() if word[0].isupper() else new


def _number(m: re.Match[str]) -> str:
    word = m.group(0)
    if word.isdigit():
        n = int(word)
        return str(n + 1 if 1900 <= n <= 2100 else (n + 2 if n + 2 <= 31 else n - 2) if n <= 31 else n * 2)
    for seq, by in ((NUMBER_WORDS, 2), (ORDINALS, 2), (WEEKDAYS, 2), (MONTHS, 3)):
        if word.lower() in (s.lower() for s in seq):
            return _shift(word, seq, by)
    return word


NUMBERS = re.compile(
    r"\b(\d+|" + "|".join(NUMBER_WORDS + list(ORDINALS)) + r")\b|\b(" + "|".join(WEEKDAYS + MONTHS) + r")\b", re.I
)


def change_numbers(text: str) -> str | None:
    """Return ``text`` with its numbers, dates, weekdays and months changed, or None when it has none."""
    changed = NUMBERS.sub(lambda m: _number(m) if m.group(1) or m.group(0)[0].isupper() else m.group(0), text)
    return changed if changed != text else None


def _negate_sentence(s: str) -> str:
    if m := re.search(r"\b(can't|cannot|won't)\b", s, re.I):
        return s[: m.start()] + POSITIVE[m.group(0).lower()] + s[m.end() :]
    if m := re.search(r"\b(\w+)n't\b", s):
        return s[: m.start()] + m.group(1) + s[m.end() :]
    if m := re.search(r"\b(not|never) ", s, re.I):
        rest = ("always " if m.group(1).lower() == "never" else "") + s[m.end() :]
        return s[: m.start()] + (rest[:1].upper() + rest[1:] if m.start() == 0 else rest)
    if m := AUXILIARY.search(s):
        return s[: m.end()] + " not" + s[m.end() :]
    if m := re.search(r"'(s|re|ve|ll|d) ", s):
        return s[: m.end()] + "not " + s[m.end() :]
    if m := re.search(r"\b(" + "|".join(PAST) + r")\b", s):
        return s[: m.start()] + "did not " + PAST[m.group(0)] + s[m.end() :]
    return "Not " + (s[0].lower() + s[1:] if len(s.split()) > 5 else s)  # a short answer may open with a name


def negate(text: str) -> str:
    """Return ``text`` with each sentence negated."""
    sentences = re.split(r"(?<=[.!?])\s+", text.replace("’", "'").strip())
    return " ".join(_negate_sentence(s) for s in sentences if s)


def candidates(item: DatasetItem, limit: int | None = None) -> list[dict[str, Any]]:
    """Return the faithful and wrong answers built from the persona's gold answers (see the module docstring)."""
    queries = [q for q in item.queries if (q.answer or "").strip()][:limit]
    answers = [str(q.answer).strip() for q in queries]
    out = []
    for i, query in enumerate(queries):
        gold, other = answers[i], answers[(i + 1) % len(answers)]
        pool = [e for j, a in enumerate(answers) if j != i for e in entities(a)]
        made = {
            "gold": gold,
            "paraphrase": paraphrase(gold),
            "entity": swap_entities(gold, pool),
            "number": change_numbers(gold),
            "negation": negate(gold),
            "other-answer": other,
        }
        for kind, text in made.items():
            if text and (kind == "gold" or text.strip() != gold):
                out.append(
                    {
                        "id": f"{item.dialogue.id}/{query.id}/{kind}",
                        "persona": item.dialogue.id,
                        "query_id": query.id,
                        "query": query.text,
                        "reference_answer": gold,
                        "gold": query.gold.model_dump(),
                        "kind": kind,
                        "faithful": kind in FAITHFUL,
                        "answer": text,
                    }
                )
    return out
