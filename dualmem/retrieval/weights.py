"""Ranker weights: the small linear model that fuses the features, as a JSON file.

The default weights ship with the package (``dualmem/data/rankers/learned.json``),
written by ``python benchmarks/fit_ranker.py`` with :func:`dualmem.retrieval.fit.fit`
on every RealMem persona and LoCoMo conversation. A weights file names its
features, so a file written for other features is refused with the fix, not
misread. ``max_per_session`` caps how many items of one session the ranked list
may hold before items of other sessions (0: no cap), from position ``cap_after``
on (the first ``cap_after`` items are the best, whatever their session).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from dualmem.errors import ConfigurationError
from dualmem.retrieval.features import FEATURES

FORMAT = "dualmem-ranker/1"
LEARNED = "learned"
PLAIN = ("vector", "hybrid", "fts")
RANKERS_HELP = "learned (default), vector, hybrid, fts, or a weights file written by dualmem.retrieval.fit"


@dataclass(frozen=True)
class RankerWeights:
    """One weight per feature, the session cap, and what the weights were fitted on (``meta``)."""

    features: tuple[str, ...]
    weights: tuple[float, ...]
    max_per_session: int = 0
    cap_after: int = 0
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if len(self.features) != len(self.weights):
            raise ConfigurationError(
                f"ranker weights name {len(self.features)} features but hold {len(self.weights)} weights"
            )
        unknown = sorted(set(self.features) - set(FEATURES))
        if unknown:
            raise ConfigurationError(
                f"ranker weights use features {unknown} that this dualmem does not compute; "
                "refit them with dualmem.retrieval.fit (or use ranker=learned)"
            )
        if self.max_per_session < 0 or self.cap_after < 0:
            raise ConfigurationError(
                f"ranker max_per_session and cap_after must be >= 0, got {self.max_per_session}, {self.cap_after}"
            )

    def vector(self) -> np.ndarray:
        """Return the weights aligned with :data:`~dualmem.retrieval.features.FEATURES` (0 for features not named)."""
        named = dict(zip(self.features, self.weights, strict=True))
        return np.asarray([named.get(name, 0.0) for name in FEATURES])

    def to_json(self) -> dict[str, Any]:
        """Return the file's JSON object."""
        return {
            "format": FORMAT,
            "features": list(self.features),
            "weights": [float(w) for w in self.weights],
            "max_per_session": self.max_per_session,
            "cap_after": self.cap_after,
            "meta": self.meta,
        }

    def save(self, path: str | Path) -> Path:
        """Write the weights to ``path`` (JSON); return it."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "weights") -> RankerWeights:
        """Return weights from their JSON object (clear error for anything else)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigurationError(
                f"{source} is not a dualmem ranker weights file (format {FORMAT}); write one with dualmem.retrieval.fit"
            )
        return cls(
            tuple(data["features"]),
            tuple(float(w) for w in data["weights"]),
            int(data.get("max_per_session", 0)),
            int(data.get("cap_after", 0)),
            dict(data.get("meta") or {}),
        )


def shipped_path() -> Path:
    """Return the path of the weights shipped with the package."""
    return Path(str(resources.files("dualmem") / "data" / "rankers" / f"{LEARNED}.json"))


def load_weights(spec: str | Path) -> RankerWeights:
    """Return the weights named by ``spec``: ``learned`` (shipped) or a weights file."""
    path = shipped_path() if str(spec) == LEARNED else Path(spec).expanduser()
    if not path.is_file():
        raise ConfigurationError(
            f"ranker {str(spec)!r} is neither one of {RANKERS_HELP.replace(', or', ' or')} nor an existing file"
        )
    return _load(str(path.resolve()), path.stat().st_mtime_ns)


@lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int) -> RankerWeights:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigurationError(
            f"ranker weights {path} cannot be read ({exc}); write them with dualmem.retrieval.fit"
        ) from None
    return RankerWeights.from_json(data, source=path)
