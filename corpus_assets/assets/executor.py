"""The executor of a build run: Dagster's in-process executor inside one pool session.

Every step of the run then shares one local process pool (``core.runtime.pool``), started at the
first chunk map and shut down when the run ends, failed or not, instead of one pool per map. A
resource cannot hold it: one with a teardown is a context manager, which sensors built without
``with`` refuse. ``execute_in_process`` (the CLI) replaces any executor: ``cli.runs.build``
opens the session itself. With Dagster's multiprocess executor each step process would hold
its own pool."""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from corpus_assets.core.runtime.pool import shared_pool
from corpus_assets.core.storage.memory import freeze_startup_heap


class _Pooled(dg.Executor):
    """``inner`` with a pool session around the whole run."""

    def __init__(self, inner: dg.Executor) -> None:
        self._inner = inner

    @property
    def retries(self) -> Any:
        return self._inner.retries

    @property
    def step_dependency_config(self) -> Any:
        return self._inner.step_dependency_config

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[Any]:
        freeze_startup_heap()  # the run worker's start-up heap, before its first layer
        with shared_pool():
            yield from self._inner.execute(plan_context, execution_plan)


@dg.executor(name="in_process_pooled", config_schema=dg.in_process_executor.config_schema)
def pooled_in_process_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
    """The in-process executor (same config), its steps sharing one pool."""
    return _Pooled(dg.in_process_executor.executor_creation_fn(init_context))
