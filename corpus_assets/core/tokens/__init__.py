"""Token materialisation, shared by mixing and packing: the tokenizer as an input by digest
(``spec``), batch encoders (``encode``), per-chunk token caches (``cache``) and the byte-level
BPE trainer (``bpe``)."""
