"""The Dagster resource that opens the data home (config, CAS, catalog) for a step."""

from typing import Optional

import dagster as dg

from corpus_assets.core.runtime.workspace import Workspace, open_workspace


class CorpusResource(dg.ConfigurableResource):
    """Names the corpus config; unset means ``CORPUS_CONFIG`` or ``$CORPUS_HOME/corpus.yaml``."""

    config_path: Optional[str] = None  # noqa: UP045 - Dagster config fields need Optional

    def workspace(self) -> Workspace:
        return open_workspace(self.config_path)
