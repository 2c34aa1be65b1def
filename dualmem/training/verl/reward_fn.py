"""VeRL custom reward entry point (``reward.custom_reward_function.path`` points at this file).

VeRL loads this file by path and merges ``reward_kwargs`` from the config into
the call; they override :class:`dualmem.training.rewards.RewardConfig` fields.
"""

from __future__ import annotations

from typing import Any

from dualmem.training.rewards import compute_score as _compute_score


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    **reward_kwargs: Any,
) -> dict[str, Any]:
    """Score one writer episode for VeRL (see :func:`dualmem.training.rewards.compute_score`)."""
    extra = dict(extra_info or {})
    extra["reward_config"] = {**reward_kwargs, **(extra.get("reward_config") or {})}
    return _compute_score(data_source, solution_str, ground_truth, extra)
