"""Exception types: each names what went wrong and how to fix it."""

from __future__ import annotations


class DualMemError(Exception):
    """Base class of every error DualMem raises on purpose."""


class ConfigurationError(DualMemError):
    """A setting, model name or path is wrong; the message says the fix."""


class DatasetError(DualMemError):
    """A data file does not match its format.

    The message is one line: ``file: $.json.path: expected X, found Y``.
    """

    def __init__(self, file: str, path: str, expected: str, found: str) -> None:
        self.file, self.path, self.expected, self.found = file, path, expected, found
        super().__init__(f"{file}: {path}: expected {expected}, found {found}")


class ModelCallError(DualMemError):
    """A model call failed: a transient error outlasted its retries, or the endpoint refused the request.

    ``transient`` says whether retrying later may succeed; ``attempts`` counts
    the calls made. Callers record it (failed chunk, judge error) and go on.
    """

    def __init__(self, message: str, *, attempts: int = 1, transient: bool = False, status: int | None = None) -> None:
        self.attempts, self.transient, self.status = attempts, transient, status
        super().__init__(message)


class LeaseTimeout(DualMemError):
    """Another writer held the namespace's write lease for longer than we were willing to wait."""


class LeaseLost(DualMemError):
    """This writer's lease expired or was taken over before its work was committed."""


__all__ = ["ConfigurationError", "DatasetError", "DualMemError", "LeaseLost", "LeaseTimeout", "ModelCallError"]
