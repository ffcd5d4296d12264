"""The deletion index's rows as SQL: their keys, columns and order, and the queries that make
them from a snapshot's members, dedup clusters and spans (whole, or the keys a child's changed
inputs reach over its parent's). Strings, and the one look at two files a string needs
(``equal_head``): ``deletion_build`` runs them in DuckDB.
"""

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SEP = "\x00"  # the smallest code point: "a" + SEP sorts before "ab", as the tuples would
COLUMN = {"record": "record_id", "object": "object", "group": "group_id"}
DUPLICATES = ("exact_duplicate", "near_duplicate")
CARRIED = ["record_id", "verdict", "representative_id", "match_id", "match_jaccard"]
SPANS = ["record_id", "record_offset", "shard", "block", "start", "end"]
ROWS = pa.schema(
    [
        ("key", pa.string()),
        ("record_id", pa.string()),
        ("verdict", pa.string()),
        ("representative_id", pa.string()),
        ("match_id", pa.string()),
        ("match_jaccard", pa.float64()),
        ("record_offset", pa.int64()),
        ("shard", pa.string()),  # the packed shard's digest (sorted by its number)
        ("block", pa.int64()),
        ("start", pa.int64()),
        ("end", pa.int64()),
    ]
)
# what a shard file holds: the packed shard's number, which the directory's ``shards`` maps to
# its digest (a child's appended last shard has a new digest, not a new number for its spans)
STORED = ROWS.set(ROWS.get_field_index("shard"), pa.field("shard", pa.int64()))
SQL_TYPES = {"key": "VARCHAR", "record_id": "VARCHAR", "verdict": "VARCHAR"}
SQL_TYPES |= {"representative_id": "VARCHAR", "match_id": "VARCHAR", "match_jaccard": "DOUBLE"}
SQL_TYPES |= {c: "BIGINT" for c in ("record_offset", "shard", "block", "start", "end")}
# the rows the narrowed passes read, staged once (``reached``)
HIT = {name: f"staging.{name}_hit" for name in ("members", "clusters", "spans")}
ORDER = ", ".join(f'"{f.name}" ASC NULLS FIRST' for f in ROWS)  # the index order


def member_key(kind: str, target: str) -> str:
    return SEP.join((kind, target, "member"))


def carried_key(kind: str, target: str) -> str:
    return SEP.join((kind, target, "carried"))


def reach_key(kind: str, target: str) -> str:
    """The packed spans of every member and carrying representative the target names."""
    return SEP.join((kind, target, "spans"))


def span_key(record_id: str) -> str:
    return SEP.join(("span", record_id))


def span_rows(span_columns: list[str], prefix: str = "") -> str:
    """The ``spanrows`` view: the spans' ``SPANS`` columns (an absent one null)."""
    names = ", ".join(f'"{c}"' for c in SPANS)
    picked = [f'"{c}"' if c in span_columns else "NULL" for c in SPANS]
    table = f"{prefix}spans"
    source = f"SELECT {', '.join(picked)} FROM {table}" if span_columns else empty(SPANS)
    return f"CREATE TEMP VIEW {prefix}spanrows ({names}) AS {source}"


def span_tails(columns: list[str], mine: Any, theirs: Any) -> list[str]:
    """The ``spantail`` and ``p_spantail`` views: the child's and the parent's ``spanrows``
    from the first row of the first row group whose bytes differ (``equal_head``) on, when
    both are one file (the rows before are equal pairs, which a positional difference drops:
    at 1.1 GB 7 of 8 row groups, 0.13 -> 0.02 CPU-s); else the whole of each."""
    skip = equal_head(mine, theirs) if isinstance(mine, str) and isinstance(theirs, str) else 0
    if not skip:
        return [f"CREATE TEMP VIEW {p}spantail AS FROM {p}spanrows" for p in ("", "p_")]
    names = ", ".join(f'"{c}"' for c in SPANS)
    picked = ", ".join(f'"{c}"' if c in columns else "NULL" for c in SPANS)
    return [
        f"CREATE TEMP VIEW {p}spantail ({names}) AS SELECT {picked} FROM read_parquet("
        f"{_paths([path])}, file_row_number = true) WHERE file_row_number >= {skip}"
        for p, path in (("", mine), ("p_", theirs))
    ]


def equal_head(mine: str, theirs: str, names: list[str] = SPANS) -> int:
    """The rows of the leading row groups of two Parquet files (same schema) in which every
    chunk of the ``names`` columns has the same bytes and row count: rows equal in those
    columns, decoded alike (a child's spans renumber their samples, not those)."""
    one, two = pq.ParquetFile(mine), pq.ParquetFile(theirs)
    if one.schema_arrow != two.schema_arrow or one.schema != two.schema:
        return 0
    read = [n for n, f in enumerate(one.schema_arrow) if f.name in names]
    rows = 0
    with open(mine, "rb") as a, open(theirs, "rb") as b:
        for g in range(min(one.metadata.num_row_groups, two.metadata.num_row_groups)):
            x, y = one.metadata.row_group(g), two.metadata.row_group(g)
            if x.num_rows != y.num_rows or not all(
                _chunk(a, x.column(c)) == _chunk(b, y.column(c)) for c in read
            ):
                break
            rows += x.num_rows
    return rows


def _chunk(file: Any, column: Any) -> bytes:
    """A column chunk's bytes (its dictionary page, if any, then its data pages)."""
    start = column.data_page_offset
    if column.has_dictionary_page and column.dictionary_page_offset is not None:
        start = min(start, column.dictionary_page_offset)
    file.seek(start)
    return file.read(column.total_compressed_size)


def queries(columns: dict[str, list[str]], narrow: bool = False) -> list[str]:
    """One query a pass: each kind's rows, then the ``span`` rows (keys in that order);
    ``narrow``: those of the affected targets and records (``staging.targets``, ``rids``),
    read from the rows ``reached`` staged."""
    spans = ", ".join(f'"{c}"' for c in SPANS)
    last = f"SELECT 'span' || chr(0) || record_id AS key, {spans} FROM spanrows"
    if narrow:
        last = last.replace("FROM spanrows", f"FROM {HIT['spans']}")
        last += " WHERE record_id IN (SELECT record_id FROM staging.rids)"
    return [*(kind_rows(kind, columns, narrow) for kind in sorted(COLUMN)), last]


def reached(columns: dict[str, list[str]]) -> list[str]:
    """Statements staging the only rows the narrowed passes read (``HIT``): the members and
    removed duplicates naming an affected target of any kind (the columns the passes read), and
    the spans of their records, of their representatives and of the changed records. Each input
    is scanned once here, not once a kind; a kind's pass takes its own rows from these."""
    kinds = [kind for kind in sorted(COLUMN) if COLUMN[kind] in columns["members"]]
    named = [COLUMN[kind] for kind in kinds]
    statements = [
        f"CREATE TABLE {HIT['members']} AS SELECT {_names(['record_id', *named])} FROM members "
        f"WHERE {' OR '.join(_wanted(kind) for kind in kinds) or 'false'}"
    ]
    rids = ["SELECT record_id FROM staging.rids", f"SELECT record_id FROM {HIT['members']}"]
    carried = [k for k in kinds if _carries(columns, k)]
    if carried:
        kept = _names([*(COLUMN[k] for k in carried), "verdict", *CARRIED])
        statements.append(
            f"CREATE TABLE {HIT['clusters']} AS SELECT {kept} FROM clusters WHERE "
            f"{_duplicates('verdict')} AND ({' OR '.join(_wanted(k) for k in carried)})"
        )
        rids.append(f"SELECT representative_id FROM {HIT['clusters']}")
    statements.append(
        f"CREATE TABLE {HIT['spans']} AS SELECT * FROM spanrows WHERE record_id IN "
        f"({' UNION ALL '.join(rids)})"
    )
    return statements


def _carries(columns: dict[str, list[str]], kind: str) -> bool:
    """Whether the clusters table names removed duplicates by ``kind`` (not before near-dedup
    wrote verdicts)."""
    return "verdict" in columns["clusters"] and COLUMN[kind] in columns["clusters"]


def _names(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in dict.fromkeys(names))


def staged(query: str, where: str = "") -> str:
    """The query's rows with a key, in ``ROWS``'s columns and SQL types."""
    fields = ", ".join(f'"{f.name}"' for f in ROWS)
    typed = ", ".join(f'CAST(NULL AS {SQL_TYPES[f.name]}) AS "{f.name}"' for f in ROWS)
    return (
        f"SELECT {fields} FROM (SELECT {typed} WHERE false UNION ALL BY NAME "
        f"(SELECT * FROM ({query}) WHERE key IS NOT NULL{where}))"
    )


def affected(
    columns: dict[str, list[str]],
    members: tuple[str, str] | None = None,
    objects: list[str] | None = None,
) -> list[str]:
    """Statements staging (``staging.affected``) every key whose rows a changed member,
    removed duplicate or span may change: the symmetric multiset differences of the child's and
    parent's inputs; a changed member's targets' ``member`` and ``spans`` keys, a changed removed
    duplicate's ``carried`` and ``spans`` keys, and the ``spans`` keys of the targets reaching a
    record whose spans changed (the removed duplicates naming such a record as representative
    are picked in the scan that diffs them). One operator a statement, so each may spill.
    ``members``: the
    child's and parent's relations the members difference reads (their parts the two do not
    share: the rows of a shared part cancel out of a multiset difference); default the whole.
    ``objects``: the only objects whose clusters rows may differ
    (``deletion_changed``): the removed duplicates are diffed over their rows and the rows
    naming no object, the changed representatives picked in a scan of their own."""
    members = members or ("members", "p_members")
    kept = ", ".join(f'"{c}"' for c in COLUMN.values() if c in columns["members"])
    statements = [
        *diff("mdiff", f"SELECT {kept} FROM {members[0]}", f"SELECT {kept} FROM {members[1]}"),
        *aligned_diff("sdiff", "spantail", "p_spantail", SPANS),
        "CREATE TABLE staging.rids AS SELECT DISTINCT record_id FROM staging.sdiff "
        "WHERE record_id IS NOT NULL",
    ]
    changed = "IN (SELECT record_id FROM staging.rids)"
    # the members and removed duplicates whose spans changed, each input scanned once
    statements.append(
        f"CREATE TABLE staging.mrids AS SELECT {kept} FROM members WHERE record_id {changed}"
    )
    carried = "verdict" in columns["clusters"]
    if carried:
        picked = [c for c in COLUMN.values() if c in columns["clusters"]]
        cols = ", ".join(f'"{c}"' for c in dict.fromkeys([*picked, "verdict", *CARRIED]))
        statements += _carried_changes(cols, _names(picked), changed, objects)
    statements.append(_targets(columns, carried))
    keys = (
        "SELECT 'span' || chr(0) || record_id AS key FROM staging.rids UNION ALL "
        "SELECT kind || chr(0) || target || chr(0) || fact FROM staging.targets"
    )
    return [*statements, f"CREATE TABLE staging.affected AS SELECT DISTINCT key FROM ({keys})"]


def _carried_changes(cols: str, picked: str, changed: str, objects: list[str] | None) -> list[str]:
    """Staging ``staging.cdiff`` (the removed duplicates' difference) and ``staging.creps``
    (the child's naming a changed representative): in one scan of each whole table, or, with
    ``objects``, over the rows of those objects (a constant list: the scan filters the rows
    before reading the other columns) and a filtered scan of the child's."""
    duplicates = _duplicates("verdict")
    if objects is not None and '"object"' in cols:
        listed = ", ".join("'" + o.replace("'", "''") + "'" for o in objects)
        mine = f"{duplicates} AND (object IS NULL OR object IN ({listed or 'NULL'}))"
        return [
            *diff(
                "cdiff",
                f"SELECT {cols} FROM clusters WHERE {mine}",
                f"SELECT {cols} FROM p_clusters WHERE {mine}",
            ),
            f"CREATE TABLE staging.creps AS SELECT {picked} FROM clusters "
            f"WHERE {duplicates} AND representative_id {changed}",
        ]
    child = f"SELECT {cols}, representative_id {changed} AS flag FROM clusters"
    parent = f"SELECT {cols}, false FROM p_clusters"
    return [
        *flagged_diff("cboth", f"{child} WHERE {duplicates}", f"{parent} WHERE {duplicates}"),
        f"CREATE TABLE staging.cdiff AS SELECT {cols} FROM staging.cboth WHERE moved",
        f"CREATE TABLE staging.creps AS SELECT {picked} FROM staging.cboth WHERE flag",
    ]


def _targets(columns: dict[str, list[str]], carried: bool) -> str:
    """Staging ``staging.targets``: (kind, target, fact) of every key the staged changes reach."""
    targets = []
    for kind in sorted(COLUMN):
        col = COLUMN[kind]
        if col not in columns["members"]:
            continue
        sources = [("staging.mdiff", "member"), ("staging.mrids", None)]
        if carried and col in columns["clusters"]:
            sources += [("staging.cdiff", "carried"), ("staging.creps", None)]
        for source, fact in sources:
            facts = f"['{fact}', 'spans']" if fact else "['spans']"
            targets.append(
                f"SELECT '{kind}' AS kind, CAST({col} AS VARCHAR) AS target, "
                f"unnest({facts}) AS fact FROM {source}"
            )
    union = " UNION ALL ".join(f"({t})" for t in targets)
    union = union or "SELECT NULL AS kind, NULL AS target, NULL AS fact"
    return (
        "CREATE TABLE staging.targets AS SELECT DISTINCT kind, target, fact "
        f"FROM ({union}) WHERE target IS NOT NULL"
    )


def unshared_members(mine: Any, theirs: Any) -> tuple[list[str], tuple[str, str] | None]:
    """Views over the child's and the parent's members parts (file paths) the other does not
    hold (same file, same digest, same rows), and their names, for the members difference;
    none unless both members are lists of parts."""
    if not (isinstance(mine, list) and isinstance(theirs, list)):
        return [], None
    shared = set(mine) & set(theirs)
    views = []
    for name, paths, whole in (("c_parts", mine, "members"), ("p_parts", theirs, "p_members")):
        kept = [path for path in paths if path not in shared]
        source = f"read_parquet({_paths(kept)})" if kept else f"(FROM {whole} WHERE false)"
        views.append(f"CREATE VIEW {name} AS SELECT * FROM {source}")
    return views, ("c_parts", "p_parts")


def _paths(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def diff(name: str, child: str, parent: str) -> list[str]:
    """Staging ``name``: the rows one of the two queries gives more often than the other (one
    aggregate over both, each read once)."""
    both = f"SELECT *, 1 AS side FROM ({child}) UNION ALL SELECT *, -1 FROM ({parent})"
    return [
        f"CREATE TABLE staging.{name} AS SELECT * EXCLUDE (side) FROM ({both}) "
        "GROUP BY ALL HAVING sum(side) <> 0"
    ]


def flagged_diff(name: str, child: str, parent: str) -> list[str]:
    """Staging ``name``: ``diff``'s rows (``moved``) and the child's rows its last column,
    ``flag``, marks (``flag``), each distinct row once: what a second scan of the child would
    select is taken from the difference's."""
    both = f"SELECT *, 1 AS side FROM ({child}) UNION ALL SELECT *, -1 FROM ({parent})"
    return [
        f"CREATE TABLE staging.{name} AS SELECT * EXCLUDE (side, flag), sum(side) <> 0 AS moved, "
        f"coalesce(bool_or(flag), false) AS flag FROM ({both}) GROUP BY ALL "
        "HAVING sum(side) <> 0 OR bool_or(flag)"
    ]


def aligned_diff(name: str, child: str, parent: str, names: list[str]) -> list[str]:
    """``diff`` of the ``names`` columns of two tables, only over the rows that differ from the
    other's row at the same position (a ``POSITIONAL JOIN``; the longer table's tail differs):
    an equal pair cancels out of a multiset difference whatever the order, and a child's spans
    keep the parent's in place but for its last shard's (at 1.1 GB: 2.8k of 500k rows, the
    difference 0.28 -> 0.09 CPU-s). ``here`` tells a row of nulls from the shorter side's pad."""
    cols = ", ".join(f'"{c}"' for c in names)
    same = " AND ".join(f'c."{c}" IS NOT DISTINCT FROM p."{c}"' for c in names)
    picked = ", ".join(f'{t}."{c}" AS "{t}_{c}"' for t in "cp" for c in names)
    pairs = f"staging.{name}_pairs"

    def side(s: str) -> str:
        renamed = ", ".join(f'"{s}_{c}" AS "{c}"' for c in names)
        return f"SELECT {renamed} FROM {pairs} WHERE {s}_here"

    return [
        f"CREATE TABLE {pairs} AS SELECT {picked}, c.here AS c_here, p.here AS p_here "
        f"FROM (SELECT {cols}, true AS here FROM {child}) c POSITIONAL JOIN "
        f"(SELECT {cols}, true AS here FROM {parent}) p "
        f"WHERE c.here IS NULL OR p.here IS NULL OR NOT ({same})",
        *diff(name, side("c"), side("p")),
    ]


def kind_rows(kind: str, columns: dict[str, list[str]], narrow: bool = False) -> str:
    """The member, carried and spans rows of one kind's targets (a null target names nothing,
    its key is null); ``narrow``: of its affected targets only, from the rows staged by
    ``reached``."""
    col = COLUMN[kind]
    if col not in columns["members"]:
        return "SELECT NULL AS key"
    members, clusters, spanrows = "members", "clusters", "spanrows"
    if narrow:
        members = f"(SELECT * FROM {HIT['members']} WHERE {_wanted(kind)})"
        clusters = f"(SELECT * FROM {HIT['clusters']} WHERE {_wanted(kind)})"
        spanrows = HIT["spans"]

    def key(target: str, fact: str) -> str:
        return f"'{kind}' || chr(0) || CAST({target} AS VARCHAR) || chr(0) || '{fact}' AS key"

    parts = [f"SELECT {key('m.' + col, 'member')}, m.record_id FROM {members} m"]
    reached = (
        f"SELECT m.{col} AS target, m.record_id AS rid FROM {members} m WHERE m.{col} IS NOT NULL"
    )
    if "verdict" in columns["clusters"] and col in columns["clusters"]:  # else: before near-dedup
        duplicates = f"c.verdict IN ({', '.join(repr(d) for d in DUPLICATES)})"
        carried = ", ".join(f"c.{c}" for c in CARRIED)
        parts.append(
            f"SELECT {key('c.' + col, 'carried')}, {carried} FROM {clusters} c WHERE {duplicates}"
        )
        reached += (
            f" UNION ALL SELECT c.{col}, c.representative_id FROM {clusters} c WHERE {duplicates}"
            f" AND c.{col} IS NOT NULL AND c.representative_id IS NOT NULL"
        )
    if columns["spans"]:
        spans = ", ".join(f's."{c}"' for c in SPANS)
        parts.append(
            f"SELECT {key('r.target', 'spans')}, {spans} FROM {spanrows} s JOIN "
            f"(SELECT DISTINCT target, rid FROM ({reached})) r ON s.record_id = r.rid"
        )
    return " UNION ALL BY NAME ".join(f"({p})" for p in parts)


def _wanted(kind: str) -> str:
    """A row names an affected target of ``kind``."""
    return (
        f"CAST({COLUMN[kind]} AS VARCHAR) IN "
        f"(SELECT target FROM staging.targets WHERE kind = '{kind}')"
    )


def _duplicates(column: str) -> str:
    return f"{column} IN ({', '.join(repr(d) for d in DUPLICATES)})"


def empty(names: list[str]) -> str:
    return "SELECT " + ", ".join(f'NULL AS "{n}"' for n in names) + " WHERE false"
