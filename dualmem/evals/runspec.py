"""What defines an evaluation run, where it lives, and whether a folder holds the same run.

A :class:`RunSpec` is everything that changes a run's results: dataset (kind,
path, a stamp of its files), framework, query limit, answering, personas, the
models and every setting except the operational ones (concurrency, where
checkpoints go, the endpoint URL and local runtime serving the named model,
secrets). Its fingerprint names the default run folder
``runs/<dataset>-<framework>-<fingerprint>``, so the same command run again
continues the same run; ``run.json`` in the folder keeps the spec, so
``dualmem eval --resume RUN`` needs nothing else, and a folder holding a
different run is refused with the settings that differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import Any

from dualmem.config import Settings, setting_default
from dualmem.datasets._validate import read_json
from dualmem.errors import ConfigurationError, DatasetError
from dualmem.redact import CREDENTIAL_SETTINGS, MASK, public_url, redact_settings
from dualmem.schema import stable_id

RUN_FILE = "run.json"
# settings that say how or where to run, not what: not part of the fingerprint (secrets are never written at all);
# the endpoint (openai_base_url) and the local runtime serve the model that chat_model names
OPERATIONAL = frozenset(
    {
        "concurrency",
        "eval_workers",
        "ray_address",
        "endpoint_concurrency",
        "endpoint_rpm",
        "checkpoint_path",
        "openai_api_key",
        "openai_base_url",
        "store_uri",
        "store_options",
        "local_engine",
    }
)
# what the reports make of a run (money, the leniency warning, how many answers calibrate the judge): changes no record
OPERATIONAL |= {"prices", "judge_leniency_max", "calibration_queries"}
SECRETS = CREDENTIAL_SETTINGS  # kept for imports of the earlier name
# the packages whose versions a run records beside dualmem's (those installed)
KEY_PACKAGES = (
    "langchain-core",
    "langchain-openai",
    "langgraph",
    "langsmith",
    "lancedb",
    "pyarrow",
    "pydantic",
    "ragas",
    "ray",
    "transformers",
    "torch",
    "sentence-transformers",
    "llama-cpp-python",
    "openai",
)


def run_store(settings: Settings, run_dir: Path) -> str:
    """Return the store of a run: the one set explicitly (--store / env), else ``<run>/lancedb``."""
    default = setting_default("store_uri")
    return settings.store_uri if settings.store_uri != default else str(run_dir / "lancedb")


def settings_of(spec: Any, **changes: Any) -> Settings:
    """Return the settings a spec recorded, with ``changes`` (settings of older dualmem versions, e.g. eval_workers,
    dropped; credential-bearing ones and masked values are never restored from a file: they come from the environment)."""
    known = set(Settings.field_names()) - CREDENTIAL_SETTINGS
    kept = {k: v for k, v in spec.settings.items() if k in known and not (isinstance(v, str) and MASK in v)}
    return Settings.resolve({**kept, **changes})


def recorded_settings(settings: Settings) -> dict[str, Any]:
    """Return the settings a run records: every field, with no credential (:func:`dualmem.redact.redact_settings`)."""
    return redact_settings(settings.flat())


def implied_writer(settings: Settings, model: Any = None) -> str | None:
    """Return the writer a run's settings imply beyond what they record (``local:smollm2``'s adapter), else None.

    A chat model given to the run (``model``) also writes, so nothing is implied then.
    """
    spec = settings.writer_for(chat_given=model is not None)
    return None if settings.writer_model or spec in (None, settings.chat_model) else spec


def ranker_stamp(settings: Settings) -> str | None:
    """Return a hash of the ranker's weights file (None for a plain store search).

    It makes a run ranked with other weights another run, even when the ``ranker`` setting reads the
    same (``learned`` after an upgrade, an edited weights file), so a resume never mixes rankings.
    """
    from dualmem.retrieval.weights import PLAIN, shipped_path

    if settings.tuning.ranker in PLAIN:
        return None
    path = shipped_path() if settings.tuning.ranker == "learned" else Path(settings.tuning.ranker).expanduser()
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def data_stamp(path: str | Path) -> str:
    """Return a stamp of a dataset file or folder (names, sizes, modification times) that changes when it does."""
    p = Path(path)
    files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
    return stable_id(
        *(
            (f.relative_to(p).as_posix() if p.is_dir() else f.name, f.stat().st_size, f.stat().st_mtime_ns)
            for f in files
        )
    )


@dataclass
class RunSpec:
    """The inputs that define one evaluation run (see the module docstring)."""

    dataset_kind: str
    path: str
    framework: str
    limit: int | None = None
    respond: bool = True
    personas: list[str] = field(default_factory=list)
    chat_model: str = ""
    judge_model: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    stamp: str = ""
    ranker_weights: str | None = None  # see ranker_stamp
    # the writer the settings resolve to when writer_model is empty and it is not the chat model (local:smollm2 writes with
    # its adapter): a run begun when the default writer was another is another run; None is left out of the fingerprint
    writer: str | None = None

    def fingerprint(self) -> str:
        """Return a short hash of everything that changes the results."""
        return fingerprint(self)

    def default_dir(self) -> Path:
        """Return the deterministic run folder of this spec."""
        return Path("runs") / f"{self.dataset_kind}-{self.framework}-{self.fingerprint()}"

    def differences(self, other: Any) -> list[str]:
        """Return ``name: old -> new`` for each result-changing input that differs from ``other``."""
        return differences(self, other)


def fingerprint(spec: Any) -> str:
    """Return a short hash of a spec dataclass (its ``settings`` field without the operational ones)."""
    data = asdict(spec)
    if data.get("writer", "") is None:  # fingerprints of runs recorded before the field existed stay the same
        del data["writer"]
    data["settings"] = _comparable(data.get("settings", {}))
    return stable_id(json.dumps(data, sort_keys=True, default=str))[:10]


def _comparable(settings: dict[str, Any]) -> dict[str, Any]:
    """Return the result-changing settings, ``writer_model`` naming the chat model read as empty (the chat model writes)."""
    out = {k: v for k, v in sorted(settings.items()) if k not in OPERATIONAL}
    if out.get("writer_model") and out.get("writer_model") == out.get("chat_model"):
        out["writer_model"] = ""
    return out


def differences(new: Any, old: Any) -> list[str]:
    """Return ``name: old -> new`` for each result-changing field (and setting) of two spec dataclasses."""
    out = []
    mine, theirs = asdict(new), asdict(old)
    for key in mine:
        if key == "settings":
            now, then = _comparable(mine[key]), _comparable(theirs.get(key, {}))
            for name in sorted(set(now) | set(then)):
                a, b = then.get(name), now.get(name)
                if a != b:
                    out.append(f"{name}: {a!r} -> {b!r}")
        elif mine[key] != theirs.get(key):
            out.append(f"{key}: {theirs.get(key)!r} -> {mine[key]!r}")
    return out


def read_run(run_dir: str | Path) -> dict[str, Any] | None:
    """Return the ``run.json`` of a folder, or None when it has none."""
    path = Path(run_dir) / RUN_FILE
    if not path.exists():
        return None
    data = read_json(path)  # a damaged file is a one-line DatasetError naming it
    if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
        raise DatasetError(str(path), "$.spec", "the run's spec, as `dualmem eval` writes it", "something else")
    return data


def spec_of(run_dir: str | Path) -> RunSpec:
    """Return the spec kept in a run folder (clear error when it is not a run folder)."""
    data = read_run(run_dir)
    if data is None:
        raise ConfigurationError(f"{run_dir} holds no {RUN_FILE}: pass a folder written by `dualmem eval` to --resume")
    return RunSpec(**data["spec"])


def _same_kind(recorded: dict[str, Any], spec: Any) -> bool:
    """Return whether a recorded spec is one of ``spec``'s kind: no unknown field, every field without a default present
    (fields added later, with defaults, may be missing from runs recorded before them)."""
    names = {f.name for f in fields(spec)}
    required = {f.name for f in fields(spec) if f.default is MISSING and f.default_factory is MISSING}
    return set(recorded) <= names and required <= set(recorded)


def claim(run_dir: Path, spec: Any, *, resume_hint: bool = True) -> dict[str, Any]:
    """Create or reopen ``run_dir`` for ``spec`` (a spec dataclass); refuse a folder of another run; return its run.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    data = read_run(run_dir)
    if data is None and any(run_dir.iterdir()):  # memory without a journal: a replay would see sessions ahead of it
        raise ConfigurationError(
            f"{run_dir} is not empty and holds no {RUN_FILE} (a run of an older dualmem, or other files); "
            "choose another --out or delete the folder"
        )
    if data is not None:
        if "spec" not in data or not _same_kind(data["spec"], spec):
            raise ConfigurationError(f"{run_dir} holds a run of another kind; choose another --out")
        earlier = type(spec)(**data["spec"])
        if fingerprint(earlier) != fingerprint(spec):
            diff = "; ".join(differences(spec, earlier)) or "dataset files changed"
            hint = f"continue it with `dualmem eval --resume {run_dir}`, or " if resume_hint else ""
            raise ConfigurationError(
                f"{run_dir} holds another run ({diff}); {hint}choose another --out (or delete the folder to start over)"
            )
    else:
        data = {
            "spec": asdict(spec),
            "fingerprint": fingerprint(spec),
            "created": _now(),
            "segments": [],
            "dualmem_revision": git_revision(),
        }
    data["segments"] = [*data.get("segments", []), _now()]
    write_run(run_dir, data)
    return data


def write_run(run_dir: Path, data: dict[str, Any]) -> None:
    """Write ``run.json`` (atomically)."""
    tmp = run_dir / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    tmp.replace(run_dir / RUN_FILE)


def git_revision() -> str | None:
    """Return the git commit of the dualmem source tree, when it is a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def versions() -> dict[str, str]:
    """Return the versions of Python, dualmem and the key dependencies installed."""
    out = {"python": platform.python_version()}
    for name in ("dualmem", *KEY_PACKAGES):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def prompt_hashes() -> dict[str, str]:
    """Return a hash of each prompt module's templates (``dualmem.prompts.*``: every upper-case constant)."""
    import importlib
    import pkgutil

    import dualmem.prompts

    out = {}
    for info in sorted(pkgutil.iter_modules(dualmem.prompts.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"dualmem.prompts.{info.name}")
        texts = {k: v for k, v in vars(module).items() if k.isupper() and isinstance(v, (str, int, dict, tuple))}
        out[info.name] = hashlib.sha256(json.dumps(texts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return out


def content_hash(path: str | Path) -> str:
    """Return the SHA-256 of a dataset file (as ``sha256sum`` prints it), or of a folder's files (names and contents, in
    name order)."""
    p = Path(path)
    digest = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]:
        if p.is_dir():
            digest.update(f.relative_to(p).as_posix().encode() + b"\0")
        with f.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def provenance(spec: Any, settings: Settings, similarity: str) -> dict[str, Any]:
    """Return what a published figure needs to be traced and re-run: versions, models and endpoint (no key), prompt
    hashes, seeds, the dataset file's hash (its path and every setting are in the run's meta and run.json)."""
    return {
        "versions": versions(),
        "dualmem_revision": git_revision(),
        "models": {
            "chat": spec.chat_model,
            "writer": settings.writer_model or spec.writer or spec.chat_model,
            "judge": spec.judge_model,
            "embedder": settings.embedder,
            "similarity": similarity,
        },
        "endpoint": public_url(settings.openai_base_url) or None,
        "prompts": prompt_hashes(),
        "seeds": {
            "temperature": settings.tuning.temperature,
            "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED"),
            "sampling": "none: the harness draws no random numbers; calibration perturbs deterministically",
        },
        "dataset": {"path": spec.path, "sha256": content_hash(spec.path), "stamp": spec.stamp},
    }
