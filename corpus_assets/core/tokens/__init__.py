"""Token materialisation, shared by mixing and packing: the tokenizer as an input by digest
(``spec``), batch encoders (``encode``), the pinned chat template (``chat_template``) and the
kind-aware record encoder with target masks (``chat``), per-chunk token caches (``cache``) and
the byte-level BPE trainer (``bpe``)."""
