"""One dynamic partition per freeze of the configured sources; every layer shares it."""

import dagster as dg

snapshots = dg.DynamicPartitionsDefinition(name="snapshots")

# One partition per alias, of the ``alias`` asset (``assets.lifecycle``): added when the alias
# is first observed, named by the catalog's alias, never typed by a user.
aliases = dg.DynamicPartitionsDefinition(name="aliases")
