"""Imported only by the forkserver of evaluation workers (:mod:`dualmem.evals.workers`), before anything else.

The forkserver imports LanceDB once so that each worker forked from it starts
without paying that import; it never opens a connection, so its LanceDB runtime
is idle at every fork, and LanceDB's warning about forking mid-operation does
not apply there. The filter lives in that process alone.
"""

import warnings

warnings.filterwarnings("ignore", message="lancedb fork support is experimental", category=RuntimeWarning)


def warm() -> None:
    """Load what every worker would otherwise load again: the OpenAI client's resources, the token counter."""
    import openai.resources  # noqa: F401 - ChatOpenAI imports it on first use (about 1 s)

    from dualmem.tokens import count_tokens

    count_tokens("warm")


warm()
