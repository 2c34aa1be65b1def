"""`dualmem eval calibrate-judge`: how lenient a dataset protocol's judge is, measured on its own gold answers
(:mod:`dualmem.evals.calibration`), written as ``calibration.json``, ``.md`` and ``.html``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dualmem.config import Settings
from dualmem.datasets import detect_kind, load_dataset
from dualmem.errors import ConfigurationError
from dualmem.evals.calibration import calibrate
from dualmem.evals.reports import write_calibration
from dualmem.models import load_chat_model, model_name


def calibrate_judge(
    dataset_kind: str,
    path: str | Path,
    judge: Any = None,
    *,
    settings: Settings | dict[str, Any] | None = None,
    personas: Sequence[str] | None = None,
    out: str | Path | None = None,
) -> Path:
    """Measure how lenient the judge of a dataset's protocol is (:mod:`dualmem.evals.calibration`; ``judge``: a model
    spec or object, default the ``judge_model`` setting); write ``calibration.json``, ``.md`` and ``.html`` into ``out``
    (default ``runs/judge-calibration-<dataset>-<file>``); return the folder."""
    settings = Settings.resolve(settings)
    path = Path(path).expanduser().resolve()
    if not path.exists():
        raise ConfigurationError(f"dataset path {path} does not exist; pass the file or folder of a dataset")
    kind = detect_kind(str(path)) if dataset_kind == "auto" else dataset_kind
    items = [it for it in load_dataset(kind, path).items if not personas or it.dialogue.id in personas]
    result = calibrate(kind, items, load_chat_model(judge, settings, role="judge"), settings)
    result["judge_model"] = (judge if isinstance(judge, str) or judge is None else model_name(judge)) or settings.judge
    where = Path(out) if out else Path("runs") / f"judge-calibration-{kind}-{path.stem}"
    return write_calibration(where, {**result, "path": str(path)})
