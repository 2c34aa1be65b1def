"""Imported only by the forkserver of evaluation workers (:mod:`dualmem.evals.workers`), before anything else.

The forkserver imports LanceDB (and the evaluating script) once so that each
worker forked from it starts without paying that import; it never opens a connection, so its LanceDB runtime
is idle at every fork, and LanceDB's warning about forking mid-operation does
not apply there. The filter lives in that process alone.
"""

import os
import warnings

warnings.filterwarnings("ignore", message="lancedb fork support is experimental", category=RuntimeWarning)


def warm() -> None:
    """Load what every worker would otherwise load again: the OpenAI client's resources, the token counter, and the
    evaluating process's main script (as ``__mp_main__``, like a worker would: its ``if __name__ == "__main__"``
    block does not run)."""
    import openai.resources  # noqa: F401 - ChatOpenAI imports it on first use (about 1 s)
    from langchain_openai import ChatOpenAI

    import dualmem.graphs.write  # noqa: F401 - the writer, imported on a persona's first session
    from dualmem.tokens import count_tokens

    count_tokens("warm")
    ChatOpenAI(model="warm", api_key="warm", base_url="http://127.0.0.1:9").root_client  # type: ignore[arg-type]  # noqa: B018 - first build: about 60 ms
    main = os.environ.get("DUALMEM_FORKSERVER_MAIN")  # dualmem.evals.workers.MAIN_ENV
    if main and os.path.isfile(main):
        from multiprocessing import process, spawn

        process.current_process()._inheriting = True  # type: ignore[attr-defined]  # as multiprocessing's own preload
        try:
            spawn.import_main_path(main)  # workers then find their main module loaded and skip running it
        except Exception:  # noqa: BLE001 - each worker then runs the script itself, as without this
            pass
        finally:
            del process.current_process()._inheriting  # type: ignore[attr-defined]


warm()
