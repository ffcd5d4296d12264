"""A layer's result as Dagster metadata the UI can plot and read.

The ``summary`` (Markdown) comes first: Dagster lists entries in insertion order, so the
sentence a person reads first is on top, not below twenty counts.

Dagster's standard table metadata fills the catalog's built-in views: ``dagster/row_count`` and
``dagster/column_schema`` describe one table, the layer's main Parquet table (``MAIN_TABLES``),
so the row count is always that table's rows (records for canonical_records, dedup_clusters
and splits; samples for mixed_samples; spans for packed_blocks, one row per block range of a
record; members for the manifest) and the schema is the core's own pyarrow schema, mapped by
``table_schema``. raw_snapshot has no table (its bytes are the source objects as frozen): it
reports its objects as rows and no column schema.

Integers and floats become numeric metadata, which the asset's Plots tab draws across
partitions (counts, removed duplicates, tokens, padding, shares); the mixture's shares are
named ``share.<source>.target`` / ``share.<source>.realised_docs`` /
``share.<source>.realised_tokens`` so each source's three plots sit together. Lists of flat rows
become tables whose columns carry their real types.

A result's ``run_stats`` (cache hits and misses, tasks run, pairs and signatures reused) say
what one run did, not what the asset is: a rebuild of the same bytes from a warm cache reports
other numbers. They go under one JSON entry, ``run``, on the materialization (which Dagster
ties to its run), never as numeric entries, so the Plots tab does not draw run noise as data.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pyarrow as pa

from corpus_assets.core.dedup.clusters import CLUSTER_COLUMNS
from corpus_assets.core.publication.member_parts import MEMBERS_SCHEMA
from corpus_assets.core.records.index import RECORD_COLUMNS
from corpus_assets.core.runtime.layer_index import LayerResult
from corpus_assets.core.training_view.mixing import MIX_COLUMNS
from corpus_assets.core.training_view.packing import SPAN_COLUMNS
from corpus_assets.core.training_view.splits import SPLIT_COLUMNS

Counts = Mapping[str, int]


@dataclass(frozen=True)
class MainTable:
    """A layer's main Parquet table: the schema the core writes it with and the count (one of
    the layer's ``counts``) that is its number of rows."""

    schema: pa.Schema | None
    rows: str


MAIN_TABLES: dict[str, MainTable] = {
    "raw_snapshot": MainTable(None, "objects"),  # source objects, not a table
    "canonical_records": MainTable(RECORD_COLUMNS, "records"),
    "dedup_clusters": MainTable(CLUSTER_COLUMNS, "records"),  # a verdict row per record
    "splits": MainTable(SPLIT_COLUMNS, "records"),
    "mixed_samples": MainTable(MIX_COLUMNS, "samples"),
    "packed_blocks": MainTable(SPAN_COLUMNS, "spans"),  # the blocks are numpy shards
    "manifest": MainTable(MEMBERS_SCHEMA, "members"),
}


def table_schema(schema: pa.Schema) -> dg.TableSchema:
    """A pyarrow schema as Dagster's: each column's Arrow type (``int64``, ``string``, ...)
    and whether it may be null."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                field.name,
                str(field.type),
                constraints=dg.TableColumnConstraints(nullable=field.nullable),
            )
            for field in schema
        ]
    )


def column_schema(layer: str) -> dict[str, dg.MetadataValue]:
    """``dagster/column_schema`` of the layer's main table; nothing for a layer without one.
    Also the asset's definition metadata: the catalog shows the columns before the first
    materialization (Dagster's advice for a schema known in advance)."""
    schema = MAIN_TABLES[layer].schema
    if schema is None:
        return {}
    return {"dagster/column_schema": dg.MetadataValue.table_schema(table_schema(schema))}


def table_metadata(layer: str, counts: Counts) -> dict[str, dg.MetadataValue]:
    """Dagster's standard ``dagster/row_count`` and ``dagster/column_schema`` of the layer's
    main table (plain keys: dagster 1.13 exports no ``TableMetadataSet``)."""
    rows = MAIN_TABLES[layer].rows
    metadata = {"dagster/row_count": dg.MetadataValue.int(counts[rows])} if rows in counts else {}
    return {**metadata, **column_schema(layer)}


def _share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def _by_prefix(counts: Counts, prefix: str) -> dict[str, int]:
    return {k.removeprefix(prefix): v for k, v in sorted(counts.items()) if k.startswith(prefix)}


def _canonical(c: Counts, details: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    reasons = ", ".join(f"{k} {v}" for k, v in _by_prefix(c, "quarantined.").items()) or "none"
    text = (
        f"**{c['records']:,} records** from {c['rows_in']:,} input lines; "
        f"{c['quarantined']:,} quarantined ({reasons}), {c['rejected']:,} rejected, "
        f"{c.get('dead_letters', 0):,} dead letters."
    )
    series = {"quarantined_fraction": _share(c["quarantined"], c["rows_in"])}
    rows = details.get("contamination") or []
    if rows:  # the decontamination report: flagged records overall and per benchmark
        series["contamination.flagged"] = float(sum(r["flagged"] for r in rows))
        for row in rows:
            series[f"contamination.flagged.{row['benchmark']}"] = float(row["flagged"])
        unchecked = sum(r["unchecked"] for r in rows)
        text += (
            f" Contamination: {int(series['contamination.flagged']):,} records flagged against "
            f"{sum(r['items'] for r in rows):,} benchmark items ({unchecked:,} unchecked)."
        )
    return series, text


def _dedup(c: Counts, details: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    series: dict[str, float] = {"removed_fraction": _share(c["removed"], c["records"])}
    for report in (details.get("classes") or {}).values():
        for size, clusters in report.get("cluster_sizes", {}).items():
            key = f"clusters_of_size.{size}"
            series[key] = series.get(key, 0.0) + clusters
    for row in details.get("near_dedup_by_script") or []:  # per script class (word, char)
        for name in ("records", "removed"):
            key = f"{name}.{row['script']}"
            series[key] = series.get(key, 0.0) + row[name]
    text = (
        f"**{c['kept']:,} kept** of {c['records']:,}: {c['exact_duplicates']:,} exact and "
        f"{c['near_duplicates']:,} near duplicates removed; {c['clusters']:,} clusters, "
        f"{c['leakage_groups']:,} leakage groups."
    )
    return series, text


def _splits(c: Counts, _d: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    names = ("train", "validation", "test")
    shares = {f"share.{n}": _share(c[n], c["records"]) for n in names}
    parts = ", ".join(f"{n} {c[n]:,} ({shares[f'share.{n}']:.1%})" for n in names)
    moved = f"{c['moves']:,} moves, {c['conflicts']:,} conflicts"
    text = f"**{c['records']:,} records**: {parts}; {moved}."
    return shares, text


def _mixed(c: Counts, details: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    """Target beside realised shares per source (documents and tokens): the mix as planned and
    as drawn, plottable across snapshots."""
    series: dict[str, float] = {}
    drawn = []
    in_unit = "doc_share" if details.get("mixing_unit") == "documents" else "token_share"
    for row in details.get("mixing_report", []):
        source, target = row["source"], float(row["target_share"])
        series[f"share.{source}.target"] = target
        series[f"share.{source}.realised_docs"] = float(row["doc_share"])
        series[f"share.{source}.realised_tokens"] = float(row["token_share"])
        drawn.append(f"{source} {float(row[in_unit]):.1%} (target {target:.1%})")
    unit = details.get("mixing_unit", "?")
    text = (
        f"**{c['samples']:,} samples**, {c['tokens']:,} tokens; drawn ({unit}): {', '.join(drawn)}."
    )
    return series, text


def _packed(c: Counts, details: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    series = {
        "padding_fraction": _share(c["pad_tokens"], c["tokens"]),
        "utilisation": c["utilisation_ppm"] / 1e6,
        "label_occupancy": c["label_occupancy_ppm"] / 1e6,
    }
    text = (
        f"**{c['blocks']:,} blocks** of {c['block_tokens']:,} tokens: "
        f"{c['content_tokens']:,} content, {c['pad_tokens']:,} padding "
        f"({series['padding_fraction']:.2%}), {c['dropped_tokens']:,} dropped."
    )
    packing = details.get("packing")  # incremental (the parent's blocks kept) or full, and why
    if packing:
        text += f" Packed {packing['mode']}: {packing['reason']}."
    return series, text


def _raw(c: Counts, _d: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    return {}, f"**{c['objects']:,} objects**, {c['bytes']:,} bytes pinned by sha256."


def _manifest(c: Counts, _d: Mapping[str, Any]) -> tuple[dict[str, float], str]:
    text = (
        f"**{c.get('members', 0):,} members**, {c.get('tokens', 0):,} tokens in "
        f"{c.get('blocks', 0):,} blocks. Registered BUILDING; the snapshot's current state, alias "
        "and generation are on this partition's latest observation (`lifecycle`)."
    )
    return {}, text


SUMMARIES: dict[str, Callable[[Counts, Mapping[str, Any]], tuple[dict[str, float], str]]] = {
    "raw_snapshot": _raw,
    "canonical_records": _canonical,
    "dedup_clusters": _dedup,
    "splits": _splits,
    "mixed_samples": _mixed,
    "packed_blocks": _packed,
    "manifest": _manifest,
}


def _column_type(values: list[Any]) -> str:
    """The narrowest Dagster column type every non-null value fits."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "bool"
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "int"
    if present and all(_is_number(v) for v in present):
        return "float"
    return "string"


def _is_number(value: Any) -> bool:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return True
    try:
        return isinstance(value, str) and float(value) == float(value)
    except ValueError:
        return False


def typed_table(rows: list[dict[str, Any]]) -> dg.TableMetadataValue:
    columns = list(rows[0])
    types = {c: _column_type([r.get(c) for r in rows]) for c in columns}
    convert: dict[str, Callable[[Any], Any]] = {"float": float, "int": int, "bool": bool}

    def cell(column: str, value: Any) -> Any:
        if value is None:
            return None
        return convert[types[column]](value) if types[column] in convert else str(value)

    schema = dg.TableSchema(columns=[dg.TableColumn(c, types[c]) for c in columns])
    records = [dg.TableRecord({c: cell(c, r.get(c)) for c in columns}) for r in rows]
    return dg.MetadataValue.table(records=records, schema=schema)


def _flat(row: Any) -> bool:
    return isinstance(row, dict) and all(
        isinstance(v, str | int | float | bool) or v is None for v in row.values()
    )


def layer_metadata(result: LayerResult) -> dict[str, Any]:
    """Every count, digest, table and summary of ``result``, typed for the UI: the summary
    first, then Dagster's table metadata, then numbers (plotted), then the rest."""
    series, text = SUMMARIES[result.layer](result.counts, result.details)
    metadata: dict[str, Any] = {"summary": dg.MetadataValue.md(text)}
    metadata.update(table_metadata(result.layer, result.counts))
    metadata["index_digest"] = dg.MetadataValue.text(result.digest)
    metadata.update({name: dg.MetadataValue.int(v) for name, v in result.counts.items()})
    metadata.update({name: dg.MetadataValue.float(v) for name, v in series.items()})
    for name, digest in result.digests.items():  # a count of the same name keeps its label
        label = f"{name}_digest" if name in result.counts else name
        metadata[label] = dg.MetadataValue.text(digest)
    if result.preview:
        metadata["preview"] = typed_table(result.preview)
    for name, value in result.details.items():
        flat = isinstance(value, list) and value and all(_flat(row) for row in value)
        metadata[name] = typed_table(value) if flat else dg.MetadataValue.json(value)
    if result.run_stats:  # this run's cache use: one JSON entry, never a plotted number
        metadata["run"] = dg.MetadataValue.json(dict(sorted(result.run_stats.items())))
    return metadata
