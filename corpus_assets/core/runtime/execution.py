"""``execution:`` in ``corpus.yaml``: where chunk tasks run. Not a policy: output bytes never
depend on it, so it is not hashed into any manifest."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# What a worker holds before its first task (interpreter, numpy, pyarrow, corpus_assets.core):
# ~200 MB measured for a spawn worker, Ray's own modules on top.
WORKER_FOOTPRINT_MB = 256
MIN_TASK_BUDGET_MB = 64  # a task's share when worker_memory_mb leaves less beyond the footprint
# host:port, ray://host:port, "auto" (the cluster this machine joined) or "local" (start one here)
RAY_ADDRESS = r"^(auto|local|(ray://)?[A-Za-z0-9._-]+:[0-9]{1,5})$"


class Execution(BaseModel):
    """``workers`` local processes (engine ``local``, the default) or a Ray cluster at
    ``address`` (engine ``ray``). Ray waits are bounded so a cluster that cannot run tasks fails
    the build instead of hanging it: a probe task must return within ``startup_timeout_s``, and
    some chunk task must finish every ``task_timeout_s``. A local map whose missing work reads
    at most ``in_process_bytes`` (as stored) runs in the build's process unless the pool is
    already up: a spawn worker's start costs ~1 CPU-s of imports (0: always the pool).
    ``worker_memory_mb`` is what one task may use: on Ray every task asks for that much of a
    node's memory (so a node runs no more tasks than fit), and near-dedup sizes its band-key
    partitions and map groups so that one task's arrays fit in it beyond the worker's own
    footprint (:meth:`task_budget_bytes`); the other partitioned stages have fixed sizes
    whose tasks stay far below the default (65,536 clusters rows a gather task, 32,768
    member records a held-out task, 262,144 member rows a packing lookup).
    ``stages``: where near-dedup's banding and verification and the held-out search run. ``auto``
    puts them on Ray's workers and keeps them in the driver with the local pool (measured on 2
    cores at 1.1 GB: the in-process path costs 30 CPU-s against 68 on two pool workers, since it
    skips verifying pairs already linked and fingerprints each record once); ``runner`` puts
    them on any runner with more than one worker; ``driver`` keeps them in the driver."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    engine: Literal["local", "ray"] = "local"
    workers: Annotated[int, Field(ge=1, le=256)] = 1
    in_process_bytes: Annotated[int, Field(ge=0)] = 8 << 20
    address: Annotated[str, Field(pattern=RAY_ADDRESS)] | None = None
    task_timeout_s: Annotated[float, Field(gt=0, le=7 * 86400)] = 1800.0
    startup_timeout_s: Annotated[float, Field(gt=0, le=86400)] = 120.0
    worker_memory_mb: Annotated[int, Field(ge=256, le=1 << 22)] = 2048
    stages: Literal["auto", "runner", "driver"] = "auto"

    def task_budget_bytes(self) -> int:
        """What one task's own data may take: ``worker_memory_mb`` less the worker's footprint
        (at least ``MIN_TASK_BUDGET_MB``)."""
        return max(self.worker_memory_mb - WORKER_FOOTPRINT_MB, MIN_TASK_BUDGET_MB) << 20

    def stages_on_runner(self) -> bool:
        """Whether the partitioned stages run as tasks on the runner (see ``stages``)."""
        if self.stages == "auto":
            return self.engine == "ray"
        return self.stages == "runner" and (self.engine == "ray" or self.workers > 1)

    @model_validator(mode="after")
    def _address_iff_ray(self) -> "Execution":
        if self.engine == "ray" and self.address is None:
            raise ValueError("engine ray needs address: host:port, ray://host:port, auto or local")
        if self.engine == "local" and self.address is not None:
            raise ValueError("address is only for engine ray")
        return self
