"""The memory writer: a dialogue's chunks written through the persona as facts and insights, exactly once.

``chunking`` cuts a history into token-bounded chunks (shared with the
baselines and training); ``recall`` gives the working view of a chunk;
``guard``/``poisoning`` stop requests to change the persona's mind; ``update``
validates a ``MemoryUpdate`` into a plan; ``core`` writes one chunk (lease,
ledger, repairs); ``emotion`` scores and reranks by emotion; ``pending`` and
``sealing`` keep chat turns until they form a chunk; ``nodes`` and ``graph``
are the ``write`` graph and its Python API (:func:`~dualmem.writer.graph.write_history`).
"""
