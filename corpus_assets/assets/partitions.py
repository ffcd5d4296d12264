"""One dynamic partition per freeze of the configured sources; every layer shares it."""

import dagster as dg

snapshots = dg.DynamicPartitionsDefinition(name="snapshots")
