"""The memory writer: a dialogue's chunks written through the persona as facts and insights, exactly once.

``chunking`` cuts a history into token-bounded chunks (shared with the
baselines and training); ``core`` writes one chunk (view, model, plan, lease,
ledger); ``history`` loops it over a history (:func:`write_history`);
``report`` is what a call did; ``emotion`` scores and reranks by emotion.
Chat turns waiting to form a chunk live with chat memory (:mod:`dualmem.chat`). The rules
of memory (the view, plans, the guard) are the pure core :mod:`dualmem.memory`;
the ``write`` graph is :mod:`dualmem.graphs.write`.
"""

from dualmem.writer.history import WriteOptions, awrite_history, write_history
from dualmem.writer.report import WriteReport

__all__ = ["WriteOptions", "WriteReport", "awrite_history", "write_history"]
