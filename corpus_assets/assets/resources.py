"""The Dagster resource that opens the data home (config, CAS, catalog) for a step."""

from typing import Optional

import dagster as dg

from corpus_assets.assets.run_workers import record_worker
from corpus_assets.core.runtime.config import config_path
from corpus_assets.core.runtime.workspace import Workspace, open_workspace


class CorpusResource(dg.ConfigurableResource):
    """Names the corpus config; unset means ``CORPUS_CONFIG`` or ``$CORPUS_HOME/corpus.yaml``."""

    config_path: Optional[str] = None  # noqa: UP045 - Dagster config fields need Optional

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Name the process running the run's steps on the run (``run_workers``), so a run
        killed without reporting is told from one still working."""
        if context.instance is not None and context.run is not None:
            record_worker(context.instance, context.run)

    def workspace(self) -> Workspace:
        return open_workspace(self.config_path)

    def missing_config(self) -> str | None:
        """Why sensors and schedules should wait rather than fail: a fresh data home (a new
        compose volume, say) has no corpus.yaml yet. A config that exists but is wrong still
        fails loudly when opened."""
        path = config_path(self.config_path)
        if path.exists():
            return None
        return (
            f"no corpus config at {path} yet: write one (or run `corpus-assets demo`); "
            "nothing to build until then"
        )
