"""RoleMemo episodes in VeRL's parquet layout: one row per (episode, writing turn).

Columns follow VeRL's ``RLHFDataset``: ``data_source``, ``agent_name``
(``dualmem_writer``), ``prompt`` (a short chat key the agent loop reads; the
real prompt is rendered per rollout from its own memory), ``ability``,
``reward_model`` (``{"style": "rule", "ground_truth": <episode gold JSON>}``)
and ``extra_info`` (``index``, ``episode_id``, ``turn``, ``turns``). The
episodes themselves (persona, namespace, the writer's chunks as the product
cuts them, the starting memory, gold) go to ``episodes.jsonl``, read by the
agent loop. The split is by persona, like the SFT export.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from dualmem.config import setting_default
from dualmem.errors import ConfigurationError
from dualmem.memory.chunking import Chunk
from dualmem.schema import Dataset, Persona
from dualmem.training.episode import Episode, build_episode
from dualmem.training.export import split_by_persona
from dualmem.training.rewards import DATA_SOURCE
from dualmem.training.verl.config import AGENT_NAME, write_agent_loop_yaml
from dualmem.training.writing import Seed


def episode_to_json(episode: Episode) -> dict[str, Any]:
    """Serialise what the agent loop needs: persona, namespace, the writer's chunks, the starting memory and the gold."""
    return {
        "id": episode.id,
        "persona": episode.persona.model_dump(mode="json"),
        "namespace": list(episode.namespace),
        "chunks": [dict(c) for c in episode.chunks],
        "start": episode.start.to_json(),
        "ground_truth": episode.ground_truth(),
    }


class StoredEpisode(Episode):
    """An episode read back from ``episodes.jsonl`` (the writer's chunks as written, gold precomputed)."""

    def __init__(self, data: dict[str, Any]) -> None:
        if "namespace" not in data:
            raise ConfigurationError(
                f"episode {data.get('id')!r} was written by an older DualMem without the writer's chunks: "
                "rewrite the data with `dualmem train rl --engine verl --prepare`"
            )
        chunks = [cast(Chunk, dict(c)) for c in data["chunks"]]
        super().__init__(
            data["id"],
            Persona.model_validate(data["persona"]),
            tuple(data["namespace"]),
            chunks,
            [],
            [],
            start=Seed.from_json(data.get("start")),
        )
        self._gt = data["ground_truth"]

    def ground_truth(self) -> dict[str, Any]:
        """Return the stored gold."""
        return self._gt


def load_episodes(path: str | Path) -> dict[str, StoredEpisode]:
    """Read ``episodes.jsonl`` into episodes by id."""
    out = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            data = json.loads(line)
            out[data["id"]] = StoredEpisode(data)
    return out


def episode_rows(episode: Episode, start: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """Return the VeRL rows of one episode: one per writing turn, in order."""
    gt = json.dumps(episode.ground_truth(), ensure_ascii=False)
    turns = len(episode.chunks)
    return [
        {
            "data_source": DATA_SOURCE,
            "agent_name": AGENT_NAME,
            "prompt": [{"role": "user", "content": f"dualmem writer episode {episode.id} turn {t}"}],
            "ability": "memory-writing",
            "reward_model": {"style": "rule", "ground_truth": gt},
            "extra_info": {"index": start + t, "episode_id": episode.id, "turn": t, "turns": turns, "split": split},
        }
        for t in range(turns)
    ]


def write_verl_dataset(
    dataset: Dataset,
    out_dir: str | Path,
    *,
    chunk_tokens: int = 4000,
    val_ratio: float = 0.1,
    seed: int = 0,
    view_k: int = setting_default("view_k"),
    view_recent: int = setting_default("view_recent"),
    val_personas: Iterable[str] = (),
    memory_embedder: str = "",
) -> dict[str, Any]:
    """Write ``train.parquet``, ``val.parquet``, ``episodes.jsonl`` and ``agent_loop.yaml``; return counts.

    Validation holds whole personas: ``val_personas`` when given, else a ``val_ratio`` share drawn by persona.
    ``view_k``, ``view_recent``, ``memory_embedder`` (empty: the embedder setting's): the rollouts' working view.
    """
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    episodes = [build_episode(item, chunk_tokens=chunk_tokens) for item in dataset.items]
    keyed: list[dict[str, Any]] = [{"persona_id": e.persona.id, "episode": e} for e in episodes]
    held = set(val_personas)
    if held:
        unknown = held - {k["persona_id"] for k in keyed}
        if unknown:
            raise ValueError(f"val_personas: no history of {', '.join(sorted(unknown))} in the dataset")
        train, val = [k for k in keyed if k["persona_id"] not in held], [k for k in keyed if k["persona_id"] in held]
    else:
        train, val = split_by_persona(keyed, eval_ratio=val_ratio, seed=seed)
    with open(out / "episodes.jsonl", "w", encoding="utf-8") as fh:
        for e in episodes:
            fh.write(json.dumps(episode_to_json(e), ensure_ascii=False) + "\n")
    counts = {}
    for name, part in (("train", train), ("val", val)):
        rows: list[dict[str, Any]] = []
        for k in part:
            rows += episode_rows(k["episode"], start=len(rows), split=name)
        pd.DataFrame(rows).to_parquet(out / f"{name}.parquet") if rows else pd.DataFrame(
            columns=["data_source", "prompt"]
        ).to_parquet(out / f"{name}.parquet")
        counts[name] = len(rows)
    write_agent_loop_yaml(out, view_k=view_k, view_recent=view_recent, memory_embedder=memory_embedder)
    return {"episodes": len(episodes), **counts, "dir": str(out)}
