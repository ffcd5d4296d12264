"""Fixtures shared by the publication tests."""

from pathlib import Path

import pytest

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets_tests.core.training_view.test_packing_incremental import (
    _active,
    _add_essays,
    _home,
)


@pytest.fixture(scope="module")
def child_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home with an active parent (p1) and its child (p2, new essays) built."""
    folder = tmp_path_factory.mktemp("parts")
    config = _home(folder / "home")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CORPUS_CATALOG_URL", raising=False)
        with open_workspace(config) as ws:
            _active(ws, "p1")
            _add_essays(folder / "home")
            build_all(ws, "p2")
    return config
