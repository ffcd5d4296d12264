"""A PyTorch ``IterableDataset`` over verified block shards, resumable by a content-checked state.

torch is an optional extra (``corpus-assets[torch]``): importing this module does not import it.
``_torch_dataset_of_pack`` (or the attribute ``BlockIterableDataset``) defines the class on first
use, at module level, so DataLoader workers started with ``spawn`` can unpickle it too.

Each item is one batch, ``{field: (b, T) tensor, ..., "block_numbers": (b,) int64}``, dtypes as
the shards hold them; use ``DataLoader(dataset, batch_size=None, num_workers=W)``. Order, worker
split and resume follow ``LoaderPlan``. The trainer says how far it got: ``state_dict(steps)``
is the state once every rank took ``steps`` batches of the current iteration (ranks step in
lockstep); ``load_state_dict`` refuses a state of another snapshot, pack, mix, tokenizer, seed
or order policy before any block is read.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

from corpus_assets.core.consumption.loader_plan import LoaderPlan
from corpus_assets.core.publication.block_reader import ReaderState

if TYPE_CHECKING:
    from corpus_assets.core.consumption.training import TrainingReader

_CLASS_NAME = "BlockIterableDataset"


def _distributed_layout(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values win; else ``torch.distributed``'s when initialised; else one process."""
    import torch.distributed as dist

    initialised = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    if world_size is None:
        world_size = dist.get_world_size() if initialised else 1
    return rank, world_size


def _define_class() -> type:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

    class BlockIterableDataset(IterableDataset):
        """Batches of one rank, split among this process's DataLoader workers."""

        def __init__(self, plan: LoaderPlan) -> None:
            super().__init__()
            self.plan = plan

        def __iter__(self) -> Any:
            info = get_worker_info()
            worker, workers = (0, 0) if info is None else (info.id, info.num_workers)
            with self.plan.open_reader() as reader:
                for numbers, fields in self.plan.batches(reader, worker, workers):
                    batch = {name: torch.from_numpy(values) for name, values in fields.items()}
                    batch["block_numbers"] = torch.from_numpy(numbers)
                    yield batch

        def state_dict(self, steps: int = 0) -> dict[str, Any]:
            return self.plan.state_after(steps).state_dict()

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.plan.load_state_dict(state)

    BlockIterableDataset.__module__ = __name__
    BlockIterableDataset.__qualname__ = _CLASS_NAME
    return BlockIterableDataset


def _dataset_class() -> type:
    cls = globals().get(_CLASS_NAME)
    if cls is None:
        cls = globals()[_CLASS_NAME] = _define_class()
    return cls


def __getattr__(name: str) -> Any:
    """``BlockIterableDataset`` is defined (importing torch) the first time it is asked for."""
    if name != _CLASS_NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _dataset_class()


def _torch_dataset_of_pack(
    cas_root: Path | str,
    identity: ReaderState,
    rank: int | None = None,
    world_size: int | None = None,
    batch_blocks: int = 1,
    verify: bool = True,
    cas_url: str | None = None,
) -> Any:
    """A ``BlockIterableDataset`` for ``identity`` (its ``pack_digest`` names the shard index).

    ``rank``/``world_size`` default to ``torch.distributed``'s; ``identity``'s epoch and
    ``blocks_consumed`` say where reading starts until ``load_state_dict`` says otherwise.
    """
    rank, world_size = _distributed_layout(rank, world_size)
    plan = LoaderPlan(cas_root, identity, rank, world_size, batch_blocks, verify, cas_url)
    return _dataset_class()(plan)


def torch_dataset_of(
    reader: "TrainingReader",
    seed: int,
    rank: int | None = None,
    world_size: int | None = None,
    batch_blocks: int = 1,
    shuffle: bool = True,
) -> Any:
    """The ``BlockIterableDataset`` of a permitted snapshot: ``reader`` checked the permit, the
    manifest's signature against the trust root and the shard index before this is made
    (``_torch_dataset_of_pack`` takes a bare pack identity and checks only the bytes)."""
    identity = reader.stream(seed, shuffle).state
    reader.block_reader  # noqa: B018 - notes every shard in the run's report
    cas_url = getattr(reader.cas, "url", None)
    return _torch_dataset_of_pack(
        reader.cas.root, identity, rank, world_size, batch_blocks, cas_url=cas_url
    )
