"""Export one memory namespace to a documented file, and import it into another store with the same retrieval.

**The file** (format ``dualmem.export``, version 1) is one JSON document, or
JSON Lines for large namespaces (``.jsonl``: the header on the first line,
then one record per line with a ``type``):

- header: ``format``, ``version``, ``exported_at``, ``namespace`` (``persona``,
  ``user``), ``embedder`` (the spec the vectors were made with, or null), ``dims``
  (vector size), ``counts`` (items, versions, ledger units);
- ``items`` (type ``item``): every item of the namespace — active, and those a
  writer DELETE superseded — as stored: ``id``, ``kind``, ``text``, ``source``
  (``session_id``, ``turn_ids``, ``chunk_id``: its provenance), ``event_time``,
  ``created_at``, ``updated_at``, ``grounding`` (the fact ids an insight cites),
  ``emotion``, ``status``, ``meta``, ``vector`` (the stored unit vector) and
  ``history`` (its ADD / UPDATE / DELETE records, oldest first:
  :mod:`~dualmem.control.history` documents their fields);
- ``versions`` (type ``version``): the version rows history is read from (same fields, no ``history``);
- ``deleted`` (type ``deleted``): ``id``, ``kind`` and ``history`` of each item deleted through the store
  API or a tool (only its version rows remain); read for information, never imported as rows;
- ``ledger`` (type ``ledger``): the writer's units — ``unit`` (chunk id), ``state``
  (``applied`` or ``pending``) and, for a pending unit, the ``payload`` (its plan) —
  so a writer resuming on the imported store skips what was written.

**Import** validates the whole file first (a malformed record is one error naming
the file, the field and what was expected; nothing is written), refuses a store
whose embedder differs from the export's (``reembed`` embeds the texts again
instead) and a namespace that already holds items (``merge`` upserts over them),
then writes every row with its own vector and times under the namespace's write
lease, in one commit of the memory table, then the ledger's units. Retrieval over
the imported namespace then ranks exactly as over the exported one. Validation
uses the writer's rules: finite vectors of the export's width, printable non-empty
ids (:func:`~dualmem.schema.check_id`), texts of at most ``MAX_ITEM_TEXT``
characters, facts and insights only, and active insights grounded in facts of the
export. A bad record is refused before anything is written; a failure while the
ledger is written removes the rows again (an empty namespace stays empty).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dualmem.control.history import history_of
from dualmem.errors import ConfigurationError, DatasetError
from dualmem.memory.versions import VERSION_OF
from dualmem.schema import MAX_ITEM_TEXT, MemoryItem, check_id, utcnow
from dualmem.stores.contract import DualStore, Namespace, PutItems

FORMAT, VERSION = "dualmem.export", 1


@dataclass
class Archive:
    """A read and validated export: its header, items (with vectors), version rows and ledger units."""

    header: dict[str, Any]
    items: list[tuple[MemoryItem, list[float]]]
    versions: list[tuple[MemoryItem, list[float]]]
    ledger: list[dict[str, str]]

    @property
    def namespace(self) -> Namespace:
        """Return the exported namespace (persona, user)."""
        return (self.header["namespace"]["persona"], self.header["namespace"]["user"])


# --------------------------------------------------------------------------- export


def records(dual: DualStore, namespace: Namespace) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(type, record)`` for the header, every item (with its history), version row and ledger unit."""
    ns = tuple(namespace)
    rows = dual.scan(ns, status=None, columns="vectors").to_pylist()
    if not rows:
        raise ConfigurationError(
            f"nothing to export: namespace {ns} holds no items in {dual.uri} (check --persona and --user)"
        )
    items: list[tuple[MemoryItem, list[float]]] = []
    versions: dict[str, list[tuple[MemoryItem, list[float]]]] = {}
    for row in rows:
        item = MemoryItem.model_validate(
            {
                **row,
                "namespace": ns,
                "source": {k: row[k] for k in ("session_id", "turn_ids", "chunk_id")},
                "meta": json.loads(row["meta"] or "{}"),
            }
        )
        pair = (item, [float(x) for x in row["vector"]])
        if item.meta.get(VERSION_OF):
            versions.setdefault(str(item.meta[VERSION_OF]), []).append(pair)
        else:
            items.append(pair)
    applied, pending = dual.ledger.units(ns)
    ledger = [{"unit": u, "state": "applied"} for u in sorted(applied)] + [
        {"unit": u, "state": "pending", "payload": p} for u, p in pending
    ]
    n_versions = sum(len(found) for found in versions.values())
    yield (
        "header",
        {
            "format": FORMAT,
            "version": VERSION,
            "exported_at": utcnow().isoformat(),
            "namespace": {"persona": ns[0], "user": ns[1]},
            "embedder": getattr(dual.embeddings, "spec", None),
            "dims": dual.dims,
            "counts": {"items": len(items), "versions": n_versions, "ledger": len(ledger)},
        },
    )
    for item, vector in items:
        history = history_of(item.id, item, [v for v, _ in versions.get(item.id, [])])
        yield "item", {**_plain(item), "vector": vector, "history": history}
    for of in sorted(versions):
        for item, vector in versions[of]:
            yield "version", {**_plain(item), "vector": vector}
    for of in sorted(set(versions) - {i.id for i, _ in items}):  # items deleted through the API: their versions remain
        states = [v for v, _ in versions[of]]
        yield "deleted", {"id": of, "kind": states[-1].kind, "history": history_of(of, None, states)}
    for unit in ledger:
        yield "ledger", unit


def _plain(item: MemoryItem) -> dict[str, Any]:
    return item.model_dump(mode="json", exclude={"namespace"})


def export_namespace(
    dual: DualStore, namespace: Namespace, out: str | Path, *, lines: bool | None = None
) -> dict[str, int]:
    """Write the namespace to ``out`` (JSON Lines when ``lines`` or the name ends in ``.jsonl``); return its counts."""
    path = Path(out)
    jsonl = path.suffix == ".jsonl" if lines is None else lines
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    try:
        counts = _write(dual, namespace, tmp, jsonl)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)  # a failed export leaves no file, and never a half-written one under the name asked for
    return counts


def _write(dual: DualStore, namespace: Namespace, tmp: Path, jsonl: bool) -> dict[str, int]:
    counts: dict[str, int] = {}
    with tmp.open("w", encoding="utf-8") as fh:
        if jsonl:
            for kind, record in records(dual, namespace):
                line = {**record, "layout": "jsonl"} if kind == "header" else {"type": kind, **record}
                fh.write(json.dumps(line, ensure_ascii=False) + "\n")
                if kind == "header":
                    counts = dict(record["counts"])
        else:
            doc: dict[str, Any] = {"items": [], "versions": [], "deleted": [], "ledger": []}
            for kind, record in records(dual, namespace):
                if kind == "header":
                    doc = {**record, **doc}
                    counts = dict(record["counts"])
                else:
                    doc[
                        {"item": "items", "version": "versions", "deleted": "deleted", "ledger": "ledger"}[kind]
                    ].append(record)
            json.dump(doc, fh, ensure_ascii=False, indent=1)
    return counts


# --------------------------------------------------------------------------- reading and validating


def _fail(file: str, where: str, expected: str, found: Any) -> DatasetError:
    text = repr(found)
    return DatasetError(file, where, expected, text if len(text) < 80 else text[:77] + "...")


def _entries(path: Path) -> tuple[dict[str, Any], list[tuple[str, str, dict[str, Any]]]]:
    """Return the header and (type, json path, record) of every record, from either layout."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read {file} ({exc.strerror or exc}); pass the file `dualmem export` wrote"
        ) from exc
    first = text.lstrip()[:1]
    if first != "{":
        raise _fail(file, "$", "a dualmem export (a JSON object, or JSON Lines starting with the header)", text[:40])
    lines = [ln for ln in text.splitlines() if ln.strip()]
    try:
        head = json.loads(lines[0])
    except json.JSONDecodeError:
        head = None  # a JSON document spread over lines
    jsonl = isinstance(head, dict) and head.get("layout") == "jsonl"
    try:
        if not jsonl:
            head = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(file, f"line {exc.lineno} column {exc.colno}", "valid JSON", exc.msg) from None
    if not jsonl:
        if not isinstance(head, dict):
            raise _fail(file, "$", "a JSON object", type(head).__name__)
        out = []
        for key, record_type in (("items", "item"), ("versions", "version"), ("ledger", "ledger")):
            values = head.get(key, [])
            if not isinstance(values, list):
                raise _fail(file, f"$.{key}", "a list", type(values).__name__)
            out += [(record_type, f"$.{key}[{i}]", v) for i, v in enumerate(values)]
        return head, out
    out = []
    for n, line in enumerate(lines[1:], start=2):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _fail(file, f"line {n}", "one JSON record per line", exc.msg) from None
        kind: Any = rec.get("type") if isinstance(rec, dict) else None
        if kind not in ("item", "version", "deleted", "ledger"):
            raise _fail(file, f"line {n}: $.type", "item, version, deleted or ledger", kind)
        out.append((kind, f"line {n}: $", rec))
    return head, out


def _header(file: str, head: dict[str, Any]) -> None:
    if head.get("format") != FORMAT:
        raise _fail(file, "$.format", f"{FORMAT!r} (a file written by `dualmem export`)", head.get("format"))
    if head.get("version") != VERSION:
        raise _fail(file, "$.version", f"{VERSION} (upgrade DualMem to read newer exports)", head.get("version"))
    ns = head.get("namespace")
    if not isinstance(ns, dict) or not all(isinstance(ns.get(k), str) and ns.get(k) for k in ("persona", "user")):
        raise _fail(file, "$.namespace", "an object with non-empty persona and user", ns)
    if not isinstance(head.get("dims"), int) or head["dims"] < 1:
        raise _fail(file, "$.dims", "the vector size, a positive integer", head.get("dims"))


def _row(file: str, where: str, rec: Any, ns: Namespace, dims: int) -> tuple[MemoryItem, list[float]]:
    if not isinstance(rec, dict):
        raise _fail(file, where, "an object", type(rec).__name__)
    vector = rec.get("vector")
    if (
        not isinstance(vector, list)
        or len(vector) != dims
        or not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in vector)
    ):
        raise _fail(
            file,
            f"{where}.vector",
            f"a list of {dims} finite numbers ($.dims)",
            vector if not isinstance(vector, list) else f"{len(vector)} values",
        )
    body = {k: v for k, v in rec.items() if k not in ("vector", "history", "type")}
    try:
        check_id(body.get("id"), "item id")
    except ValueError as exc:
        raise _fail(file, f"{where}.id", "a non-empty printable id without / or \\", str(exc)) from None
    text = body.get("text")
    if isinstance(text, str) and len(text) > MAX_ITEM_TEXT:
        raise _fail(file, f"{where}.text", f"at most {MAX_ITEM_TEXT} characters", f"{len(text)} characters")
    if rec.get("kind") not in ("fact", "insight"):
        raise _fail(file, f"{where}.kind", "fact or insight", rec.get("kind"))
    try:
        item = MemoryItem.model_validate({**body, "namespace": ns})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise _fail(file, f"{where}.{field}", err["msg"].lower(), err.get("input")) from None
    return item, [float(x) for x in vector]


def read_export(path: str | Path) -> Archive:
    """Read and validate an export (either layout); raise a DatasetError naming the file and field of a bad record."""
    file = Path(path)
    head, entries = _entries(file)
    _header(str(file), head)
    ns, dims = (head["namespace"]["persona"], head["namespace"]["user"]), head["dims"]
    items: list[tuple[MemoryItem, list[float]]] = []
    versions: list[tuple[MemoryItem, list[float]]] = []
    ledger: list[dict[str, str]] = []
    for kind, where, rec in entries:
        if kind == "deleted":
            continue  # history of deleted items: derived from the version rows again on the importing side
        if kind == "ledger":
            if (
                not isinstance(rec, dict)
                or not isinstance(rec.get("unit"), str)
                or rec.get("state") not in ("applied", "pending")
            ):
                raise _fail(str(file), where, "a ledger unit: {unit: str, state: applied|pending}", rec)
            ledger.append({"unit": rec["unit"], "state": rec["state"], "payload": str(rec.get("payload") or "")})
        else:
            (items if kind == "item" else versions).append(_row(str(file), where, rec, ns, dims))
    seen: set[str] = set()
    for item, _ in [*items, *versions]:
        if item.id in seen:
            raise _fail(str(file), "$.items", "one record per item id", item.id)
        seen.add(item.id)
    facts = {item.id for item, _ in [*items, *versions] if item.kind == "fact"}
    facts |= {str((item.meta or {}).get(VERSION_OF)) for item, _ in versions if item.kind == "fact"}
    for item, _ in items:
        if item.kind == "insight" and item.status == "active" and not set(item.grounding) <= facts:
            missing = sorted(set(item.grounding) - facts)[:3]
            raise _fail(
                str(file), f"$.items[{item.id}].grounding", "ids of facts in the export (a grounded insight)", missing
            )
    for unit in ledger:
        try:
            check_id(unit["unit"], "ledger unit")
        except ValueError as exc:
            raise _fail(str(file), "$.ledger", "non-empty printable unit ids", str(exc)) from None
    return Archive(head, items, versions, ledger)


# --------------------------------------------------------------------------- import


def import_archive(
    archive: Archive,
    dual: DualStore,
    *,
    namespace: Sequence[str] | None = None,
    merge: bool = False,
    reembed: bool = False,
    wait_s: float | None = None,
) -> dict[str, int]:
    """Write an archive's rows into ``dual`` under ``namespace`` (default: the exported one); return the counts.

    Checks (before writing): the store's embedder matches the export's (else ``reembed``), the namespace is empty
    (else ``merge``). Rows keep their ids, vectors and times; the ledger's units are marked as they were.
    """
    ns = tuple(namespace) if namespace else archive.namespace
    spec, mine = archive.header.get("embedder"), getattr(dual.embeddings, "spec", None)
    if not reembed and (archive.header["dims"] != dual.dims or (spec and mine and spec != mine)):
        raise ConfigurationError(
            f"the export's vectors come from {spec or 'an unnamed embedder'} ({archive.header['dims']} dims) but the store "
            f"at {dual.uri} embeds with {mine or 'another embedder'} ({dual.dims} dims); open the store with that embedder "
            f"(DUALMEM_EMBEDDER={spec}) or pass --reembed to embed the texts again"
        )
    held = dual.count(ns, status=None)
    if held and not merge:
        raise ConfigurationError(
            f"namespace {ns} at {dual.uri} already holds {held} item(s); import into an empty namespace, "
            "or pass --merge to upsert the export's items over them"
        )
    rows = [*archive.items, *archive.versions]
    items = tuple(item.model_copy(update={"namespace": ns}) for item, _ in rows)
    vectors = None if reembed else tuple(tuple(v) for _, v in rows)
    with dual.exclusive(ns, wait_s=wait_s):
        dual.batch([PutItems(items, vectors, keep_times=True)])  # one commit: every row, or none
        try:
            for unit in archive.ledger:
                dual.ledger.mark(ns, unit["unit"], unit["state"], unit.get("payload") or "")
        except BaseException:
            if not held:  # the namespace was empty: leave it so
                dual.drop_namespace(ns)
            raise
    return {"items": len(archive.items), "versions": len(archive.versions), "ledger": len(archive.ledger)}
