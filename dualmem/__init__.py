"""DualMem: long-term memory for role-playing agents, written through their persona."""

from dualmem.config import Settings
from dualmem.errors import ConfigurationError, DatasetError, DualMemError

__version__ = "0.6.0.dev0"
__all__ = ["ConfigurationError", "DatasetError", "DualMemError", "Settings", "__version__"]
