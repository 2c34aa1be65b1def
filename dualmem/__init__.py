"""DualMem: long-term memory for role-playing agents, written through their persona."""

from dualmem.config import Settings
from dualmem.errors import ConfigurationError, DatasetError, DualMemError

__version__ = "0.5.0"
__all__ = ["ConfigurationError", "DatasetError", "DualMemError", "Settings", "__version__"]
