"""Control over memory: forget a user (every trace, down to old LanceDB versions), export and import it, read an
item's history, reach it over MCP.

- :mod:`~dualmem.control.forget` — :func:`forget` a user, every user of a persona, or one item
  (:mod:`~dualmem.control.places` says where a user's data lives, :mod:`dualmem.stores.erase` deletes it from the
  tables and :mod:`dualmem.stores.purge` makes deleted rows physically gone, :mod:`~dualmem.control.checkpoints`
  finds and deletes the user's checkpointed threads);
- :mod:`~dualmem.control.export` — the documented export file, :func:`export_namespace`, :func:`read_export`,
  :func:`import_archive`;
- :mod:`~dualmem.control.history` — :func:`item_history`: every ADD / UPDATE / DELETE of an item;
- :mod:`~dualmem.control.mcp` — the memory as MCP tools (needs the ``mcp`` extra; imported on use).
"""

from dualmem.control.checkpoints import thread_metadata
from dualmem.control.export import export_namespace, import_archive, read_export
from dualmem.control.forget import ForgetReport, aforget, forget
from dualmem.control.history import HistoryRecord, item_history

__all__ = [
    "ForgetReport",
    "HistoryRecord",
    "aforget",
    "export_namespace",
    "forget",
    "import_archive",
    "item_history",
    "read_export",
    "thread_metadata",
]
