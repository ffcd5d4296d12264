"""A Hugging Face ``datasets.IterableDataset`` over verified block shards, never the whole pack.

``datasets`` is an optional extra (``corpus-assets[hf]``) imported only when a loader is made.
Rows are the pack's blocks in block order, one ``{field: T values}`` row per block, each read
through ``BlockReader`` so a flipped shard byte raises ``ShardCorruptError`` (naming the shard and
chunk) out of the iteration. The pack's shards are the dataset's ``gen_kwargs`` shards, so
``datasets`` splits them among DataLoader workers and ``shuffle`` reorders them.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from corpus_assets.core.release.block_reader import BlockReader
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.shards import ShardIndex, load_index

ROWS_PER_READ = 256  # blocks read (and verified) per reader call


def hf_features(index: ShardIndex) -> Any:
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


def _block_rows(
    cas_root: str, index_digest: str, verify: bool, ranges: list[list[int]]
) -> Iterator[dict[str, np.ndarray]]:
    """The generator ``datasets`` runs (in its own worker too): blocks of ``ranges`` in order."""
    with BlockReader.open(ContentStore(Path(cas_root)), index_digest, verify) as reader:
        for start, stop in ranges:
            for first in range(start, stop, ROWS_PER_READ):
                for batch in reader.batches(first, min(stop, first + ROWS_PER_READ)):
                    for row in range(len(next(iter(batch.values())))):
                        yield {name: values[row] for name, values in batch.items()}


def load_hf_dataset(cas: ContentStore, index_digest: str, verify: bool = True) -> Any:
    """``datasets.IterableDataset`` of the pack named by ``index_digest`` (its shard index)."""
    import datasets

    index = load_index(cas, index_digest)
    ranges = [[entry.first_block, entry.first_block + entry.blocks] for entry in index.shards]
    return datasets.IterableDataset.from_generator(
        _block_rows,
        features=hf_features(index),
        gen_kwargs={
            "cas_root": str(cas.root),
            "index_digest": index_digest,
            "verify": verify,
            "ranges": ranges,
        },
    )
