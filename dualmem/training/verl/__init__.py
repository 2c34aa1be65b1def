"""VeRL 0.9 GRPO for the writer: launch config, parquet dataset, agent loop and reward entry point.

Importing this package does not import VeRL; ``config``, ``dataset`` and
``reward_fn`` work without it, ``agent_loop`` needs ``verl==0.9.1``.
"""
