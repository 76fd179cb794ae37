"""Module-level task functions for the worker-pool tests: a spawned worker finds a task's function by importing its
module, so these cannot live in a test function (``tests/`` is on the workers' ``sys.path`` as on the caller's)."""

from fda_core.experiments.worker_pool import shared_object


def scaled(item: int) -> dict[str, int]:
    """``item`` times the shared object's ``factor``, with the worker's view of that object."""
    return {"value": shared_object()["factor"] * item}
