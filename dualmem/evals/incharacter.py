"""InCharacter's data and metrics: questionnaires, dimension types, labels, batching, fidelity scores.

The questionnaires (``BFI.json``: 44 items, 1-5; ``16Personalities.json``: 60
items, MBTI-like, 1-7) carry per item the dimension and the interview form of
the question, and per dimension a description. A dimension is scored on the
scale InCharacter's expert rating uses: BFI 1-5, 16Personalities the
percentage of the dimension's first pole (E, S, T, P; 0-100). Its type is H
above the midpoint (3 or 50), else L. Labels (``characters_labels.json``, or a
persona file's ``personality``) give per dimension ``{score, type}`` with type
H, L or X (no consensus: left out of every metric).

>>> fidelity({"a": {"E/I": 80.0, "S/N": 20.0}}, {"a": {"E/I": {"score": 90, "type": "H"}, "S/N": {"score": 60, "type": "H"}}},
...          MBTI_SCALE)["acc_dim"]
0.5
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dualmem.errors import ConfigurationError

T = TypeVar("T")
NAMES = {"bfi": "BFI", "mbti": "16Personalities", "16personalities": "16Personalities"}
DIMENSIONS = {
    "BFI": ("Extraversion", "Neuroticism", "Conscientiousness", "Agreeableness", "Openness"),
    "16Personalities": ("E/I", "S/N", "T/F", "P/J"),
}
LABEL_SOURCES = ("annotation", "pdb")


@dataclass(frozen=True)
class Scale:
    """The score scale of a questionnaire's dimensions: bounds and the midpoint that splits H from L."""

    low: float
    high: float

    @property
    def midpoint(self) -> float:
        """Return the H/L threshold (a score above it is H)."""
        return (self.low + self.high) / 2

    def type_of(self, score: float) -> str:
        """Return H (above the midpoint) or L."""
        return "H" if score > self.midpoint else "L"

    def normalised(self, score: float) -> float:
        """Return ``score`` mapped to 0-1."""
        return (score - self.low) / (self.high - self.low)


BFI_SCALE = Scale(1.0, 5.0)
MBTI_SCALE = Scale(0.0, 100.0)


@dataclass(frozen=True)
class Item:
    """One questionnaire item: its id, dimension and the question asked in the interview."""

    id: str
    dimension: str
    question: str


@dataclass(frozen=True)
class Questionnaire:
    """A personality questionnaire as the interview and the assessment use it."""

    name: str
    items: tuple[Item, ...]
    dimensions: tuple[str, ...]
    descriptions: Mapping[str, str] = field(default_factory=dict)

    @property
    def two_poles(self) -> bool:
        """Return True for 16Personalities (a percentage of the first pole per dimension)."""
        return self.name == "16Personalities"

    @property
    def scale(self) -> Scale:
        """Return the scale dimension scores are given on."""
        return MBTI_SCALE if self.two_poles else BFI_SCALE

    def items_of(self, dimension: str) -> list[Item]:
        """Return the items of one dimension, in questionnaire order."""
        return [i for i in self.items if i.dimension == dimension]


def questionnaire_name(name: str) -> str:
    """Return the questionnaire file name of ``bfi``, ``mbti`` or ``16personalities`` (clear error otherwise)."""
    try:
        return NAMES[name.strip().lower()]
    except KeyError:
        raise ConfigurationError(f"unknown questionnaire {name!r}; use bfi or mbti (16Personalities)") from None


def load_questionnaire(folder: str | Path, name: str) -> Questionnaire:
    """Read ``<folder>/<BFI|16Personalities>.json`` into a :class:`Questionnaire`."""
    qname = questionnaire_name(name)
    path = Path(folder) / f"{qname}.json"
    if not path.exists():
        raise ConfigurationError(f"{path} not found: pass the InCharacter data folder (../shared/data/incharacter)")
    raw = json.loads(path.read_text(encoding="utf-8"))
    items = tuple(
        Item(id=str(k), dimension=q["dimension"], question=q["rewritten_en"])
        for k, q in sorted(raw["questions"].items(), key=lambda kv: int(kv[0]))
        if q.get("dimension")
    )
    return Questionnaire(name=qname, items=items, dimensions=DIMENSIONS[qname], descriptions=raw["prompts"]["dim_desc"])


def split_batches(items: Sequence[T], size: int = 4) -> list[list[T]]:
    """Split a dimension's answers into batches of 3-4, as InCharacter does (fewer than 6: one batch)."""
    if len(items) < 2 * (size - 1):
        return [list(items)]
    batches = [list(items[i : i + size]) for i in range(0, len(items), size)]
    for i in range(size - 1 - len(batches[-1])):  # top the last batch up to size - 1 from the first ones
        batches[-1].append(batches[i].pop())
    return batches


def mbti_labels(code: str) -> dict[str, dict[str, Any]]:
    """Return 16Personalities labels from a four-letter type (``INTJ``): H for E, S, T, P."""
    code = code.strip().upper()
    if len(code) != 4 or any(c not in pair for c, pair in zip(code, ("EI", "SN", "TF", "JP"), strict=True)):
        raise ConfigurationError(f"MBTI type {code!r} is not four letters like INTJ")
    first = {"E/I": "E", "S/N": "S", "T/F": "T", "P/J": "P"}
    letters = dict(zip(("E/I", "S/N", "T/F", "P/J"), code, strict=True))
    return {d: {"score": None, "type": "H" if letters[d] == first[d] else "L"} for d in first}


def normalise_labels(labels: Mapping[str, Any] | None) -> dict[str, dict[str, dict[str, Any]]]:
    """Return ``{questionnaire: {dimension: {score, type}}}`` from labels as InCharacter writes them (or ``MBTI: "INTJ"``)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key, value in (labels or {}).items():
        if key.upper() in ("MBTI", "16PERSONALITIES") and isinstance(value, str):
            out["16Personalities"] = mbti_labels(value)
        elif key in DIMENSIONS:
            out[key] = {d: dict(v) for d, v in value.items()}
    return out


def load_labels(path: str | Path, source: str = "annotation") -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Read a labels file: InCharacter's ``{annotation|pdb: {code: labels}}`` or ``{persona id: labels}``."""
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    if source not in LABEL_SOURCES:
        raise ConfigurationError(f"label source {source!r}: use one of {', '.join(LABEL_SOURCES)}")
    if set(raw) & set(LABEL_SOURCES):
        raw = raw[source]
    return {code: normalise_labels(value) for code, value in raw.items()}


@dataclass(frozen=True)
class Character:
    """One of InCharacter's labelled characters."""

    code: str
    name: str
    aliases: tuple[str, ...]
    experimenter: str


def load_characters(folder: str | Path) -> list[Character]:
    """Read ``characters.json`` of the InCharacter folder (English characters first, then the others, by index)."""
    raw = json.loads((Path(folder) / "characters.json").read_text(encoding="utf-8"))
    rows = sorted(raw.items(), key=lambda kv: kv[1].get("idx", 0))
    return [
        Character(
            code=code,
            name=next((a for a in v["alias"] if a.isascii()), v["alias"][0]),
            aliases=tuple(v["alias"]),
            experimenter=v.get("experimenter", ""),
        )
        for code, v in rows
    ]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def fidelity(
    predictions: Mapping[str, Mapping[str, float]],
    labels: Mapping[str, Mapping[str, Mapping[str, Any]]],
    scale: Scale,
) -> dict[str, Any]:
    """Return InCharacter's measured alignment of predicted dimension scores with labels.

    ``acc_dim``: share of labelled (H/L) dimensions whose predicted type matches;
    ``acc_full``: share of labelled subjects whose every labelled dimension
    matches; ``mae`` / ``mse``: errors of scores normalised to 0-1 by the
    scale; ``per_dimension``: ``acc_dim`` of each dimension. X labels and
    dimensions without a prediction are left out.
    """
    hits: list[bool] = []
    errors: list[float] = []
    per_dim: dict[str, list[bool]] = {}
    full: list[bool] = []
    for subject, dims in labels.items():
        scores = predictions.get(subject) or {}
        marks = []
        for dim, label in dims.items():
            if label.get("type") not in ("H", "L") or scores.get(dim) is None or math.isnan(float(scores[dim])):
                continue
            ok = scale.type_of(float(scores[dim])) == label["type"]
            marks.append(ok)
            per_dim.setdefault(dim, []).append(ok)
            if label.get("score") is not None:
                errors.append(scale.normalised(float(scores[dim])) - scale.normalised(float(label["score"])))
        hits += marks
        if marks:
            full.append(all(marks))
    return {
        "acc_dim": _mean([float(h) for h in hits]),
        "acc_full": _mean([float(f) for f in full]),
        "mae": _mean([abs(e) for e in errors]),
        "mse": _mean([e * e for e in errors]),
        "n_dimensions": len(hits),
        "n_subjects": len(full),
        "per_dimension": {d: _mean([float(x) for x in v]) for d, v in per_dim.items()},
    }


def agreement(
    a: Mapping[str, Mapping[str, float]], b: Mapping[str, Mapping[str, float]], scale: Scale
) -> dict[str, Any]:
    """Return how two conditions agree: share of dimensions of the same type, mean absolute normalised difference."""
    same: list[bool] = []
    diffs: list[float] = []
    for subject, dims in a.items():
        for dim, score in dims.items():
            other = (b.get(subject) or {}).get(dim)
            if score is None or other is None:
                continue
            same.append(scale.type_of(score) == scale.type_of(other))
            diffs.append(abs(scale.normalised(score) - scale.normalised(other)))
    return {"same_type": _mean([float(s) for s in same]), "mean_abs_diff": _mean(diffs), "n_dimensions": len(same)}
