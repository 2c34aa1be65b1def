"""The memory browser (``dualmem ui``): see what a character remembers about a user, where each memory came from and
why retrieval would recall it — server-rendered pages over any store, with the same authentication rules as the MCP
server (:mod:`dualmem.ui.app`); what the pages show is read by :mod:`dualmem.ui.data`."""
