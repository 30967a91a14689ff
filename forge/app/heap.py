"""The process's startup heap, kept out of the garbage collector's full collections.

A forgehand process holds some 160,000 container objects once its modules are imported and its app
is built (Litestar, SQLAlchemy, the docker SDK, the templates). Every full collection walked all of
them: about 130 ms with the event loop stopped, which a busy transcript stream (thousands of events
a second, each a few short-lived dicts) brought several times a minute, a pause every SSE client,
API call and model stream of the process felt. Frozen once at startup (`gc.freeze`), they are
never walked again; what requests and runs allocate is collected as before. Objects frozen are only
lost to the cycle collector (reference counting still frees them), and what is alive at startup
lives as long as the process anyway."""

import gc


def freeze_startup_heap() -> None:
    """Call once the process has imported and built what it keeps (before serving)."""
    gc.collect()  # cycles already garbage are freed, not frozen
    gc.freeze()
