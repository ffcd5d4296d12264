"""A byte-level BPE trained with Hugging Face ``tokenizers``, as a ``tokenizer.json`` file.

The model is GPT-2 style: ByteLevel pre-tokenizer (its regex, no prefix space) and decoder, the
full 256-byte initial alphabet (every text encodes, nothing is unknown), the special tokens
first (ids 0, 1, ...), pairs seen fewer than ``MIN_FREQUENCY`` times never merged, and no
post-processor (so ``encode(text).ids`` has no specials in it; the token cache adds the declared
ones). Texts arrive as an iterator of batches and are not kept: the trainer holds word counts.

Determinism: the same texts give the same bytes. ``tokenizers`` 0.23 counts words and pairs in
parallel (rayon), but merges are chosen by (count, then pair ids) and the file's maps are written
sorted, so thread count and scheduling do not show: ``test_tokens`` trains twice in one process
and once with ``RAYON_NUM_THREADS=1`` and compares the bytes. What can change them is another
``tokenizers`` version (pinned in ``uv.lock``) or another order of the texts (fixed: canonical
chunk order, then record order).
"""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

MIN_FREQUENCY = 2
ALPHABET = 256


def train_byte_level_bpe(
    batches: Iterable[list[str]], vocab_size: int, special_tokens: list[str]
) -> bytes:
    """The ``tokenizer.json`` bytes of a byte-level BPE of at most ``vocab_size`` ids."""
    if vocab_size < ALPHABET + len(special_tokens):
        raise ValueError(
            f"vocab size {vocab_size} is below the 256 byte tokens + "
            f"{len(special_tokens)} special tokens a byte-level BPE starts with"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(batches, trainer=trainer)
    return tokenizer.to_str().encode("utf-8")
