"""The mixed_samples layer: the training stream drawn from the train split: the family's front.

Other packages import from here only. :mod:`.build` is the layer, :mod:`.plan` the pure integer
plan (how many documents or tokens each source contributes) and :mod:`.select` the pure
selection and order (a content-keyed 64-bit key per source and pass).
"""

from corpus_assets.core.training_view.mixing.build import CODE, build_mixed_samples
from corpus_assets.core.training_view.mixing.select import MIX_COLUMNS

__all__ = ["CODE", "MIX_COLUMNS", "build_mixed_samples"]
