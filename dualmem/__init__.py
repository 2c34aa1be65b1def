"""DualMem: long-term memory for role-playing agents, written through their persona."""

from dualmem import _moved
from dualmem.config import Settings
from dualmem.errors import ConfigurationError, DatasetError, DualMemError

__version__ = "0.5.0.dev0"
_moved.install()  # moved modules keep their old names for one minor release (see dualmem._moved)
__all__ = ["ConfigurationError", "DatasetError", "DualMemError", "Settings", "__version__"]
