"""A Hugging Face ``datasets.IterableDataset`` over verified block shards, never the whole pack.

``datasets`` is an optional extra (``corpus-assets[hf]``) imported only when a loader is made.
Rows are the pack's blocks in block order, one row per block, each field a fixed-length list of
its dtype. Each read goes through ``BlockReader``, so a flipped shard byte raises
``ShardCorruptError`` (naming the shard and chunk) out of the iteration. The dataset's shards
are the pack's shards, so ``datasets`` splits them among DataLoader workers and ``shuffle``
reorders them.

Rows travel as Arrow tables built zero-copy from the verified reads (``ArrowExamplesIterable``,
the iterable ``Dataset.to_iterable_dataset`` and streaming builders use; ``datasets`` is pinned
for it): ``IterableDataset.from_generator`` turns every value into a Python object and formats
it back, 10x slower per row and 100x per batch (bench/readers_bench.py). Note that
``with_format("numpy")`` widens integers to int64 (``datasets``' choice); the Arrow columns keep
the shard dtypes.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from corpus_assets.core.publication.block_reader import BlockReader
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_s3 import open_content_store
from corpus_assets.core.storage.shards import ShardIndex, load_index

if TYPE_CHECKING:
    from corpus_assets.core.consumption.training import TrainingReader

ROWS_PER_TABLE = 256  # blocks read (and verified) per Arrow table


def _hf_features(index: ShardIndex) -> Any:
    """``datasets.Features``: each field a fixed-length ``List`` of its numpy dtype."""
    import datasets

    return datasets.Features(
        {
            field.name: datasets.List(
                datasets.Value(np.dtype(field.dtype).name), length=index.block_tokens
            )
            for field in index.fields
        }
    )


def _block_tables(
    cas_root: str,
    index_digest: str,
    verify: bool,
    ranges: list[list[int]],
    cas_url: str | None = None,
) -> Iterator[tuple[str, pa.Table]]:
    """(key, table of up to ``ROWS_PER_TABLE`` blocks) for the block ``ranges``, in order; the
    tables' columns are ``fixed_size_list<dtype>[T]`` views of the verified reads."""
    cas = open_content_store(Path(cas_root), cas_url)
    with BlockReader.open(cas, index_digest, verify) as reader:
        tokens = reader.index.block_tokens
        for start, stop in ranges:
            for first in range(start, stop, ROWS_PER_TABLE):
                for batch in reader.batches(first, min(stop, first + ROWS_PER_TABLE)):
                    columns = {
                        name: pa.FixedSizeListArray.from_arrays(
                            pa.array(np.ascontiguousarray(values).reshape(-1)), tokens
                        )
                        for name, values in batch.items()
                    }
                    yield f"{first}", pa.table(columns)


def _hf_dataset_of_pack(cas: ContentStore, index_digest: str, verify: bool = True) -> Any:
    """``datasets.IterableDataset`` of the pack named by ``index_digest`` (its shard index)."""
    import datasets
    from datasets.iterable_dataset import ArrowExamplesIterable

    index = load_index(cas, index_digest)
    ranges = [[entry.first_block, entry.first_block + entry.blocks] for entry in index.shards]
    kwargs = {
        "cas_root": str(cas.root),
        "cas_url": getattr(cas, "url", None),  # an object-store CAS: the workers read it too
        "index_digest": index_digest,
        "verify": verify,
        "ranges": ranges,
    }
    info = datasets.DatasetInfo(features=_hf_features(index))
    return datasets.IterableDataset(ArrowExamplesIterable(_block_tables, kwargs), info=info)


def hf_dataset_of(reader: "TrainingReader", verify: bool = True) -> Any:
    """The pack of a permitted snapshot: ``reader`` checked the permit, the manifest's signature
    against the trust root and the shard index before this is made (``_hf_dataset_of_pack`` takes a
    bare pack digest and checks only the bytes)."""
    reader.block_reader  # noqa: B018 - notes every shard in the run's report
    return _hf_dataset_of_pack(reader.cas, reader.pack_digest, verify)
