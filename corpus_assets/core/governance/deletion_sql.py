"""The deletion index's rows as SQL: their keys, columns and order, and the queries that make
them from a snapshot's members, dedup clusters and spans (whole, or the keys a child's changed
inputs reach over its parent's). Strings only: ``deletion_build`` runs them in DuckDB.
"""

from typing import Any

import pyarrow as pa

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


def queries(columns: dict[str, list[str]], narrow: bool = False) -> list[str]:
    """One query a pass: each kind's rows, then the ``span`` rows (keys in that order);
    ``narrow``: those of the affected targets and records (``staging.targets``, ``rids``)."""
    spans = ", ".join(f'"{c}"' for c in SPANS)
    last = f"SELECT 'span' || chr(0) || record_id AS key, {spans} FROM spanrows"
    if narrow:
        last += " WHERE record_id IN (SELECT record_id FROM staging.rids)"
    return [*(kind_rows(kind, columns, narrow) for kind in sorted(COLUMN)), last]


def staged(query: str, where: str = "") -> str:
    """The query's rows with a key, in ``ROWS``'s columns and SQL types."""
    fields = ", ".join(f'"{f.name}"' for f in ROWS)
    typed = ", ".join(f'CAST(NULL AS {SQL_TYPES[f.name]}) AS "{f.name}"' for f in ROWS)
    return (
        f"SELECT {fields} FROM (SELECT {typed} WHERE false UNION ALL BY NAME "
        f"(SELECT * FROM ({query}) WHERE key IS NOT NULL{where}))"
    )


def affected(columns: dict[str, list[str]], members: tuple[str, str] | None = None) -> list[str]:
    """Statements staging (``staging.affected``) every key whose rows a changed member,
    removed duplicate or span may change: the symmetric multiset differences of the child's and
    parent's inputs; a changed member's targets' ``member`` and ``spans`` keys, a changed removed
    duplicate's ``carried`` and ``spans`` keys, and the ``spans`` keys of the targets reaching a
    record whose spans changed. One operator a statement, so each may spill. ``members``: the
    child's and parent's relations the members difference reads (their parts the two do not
    share: the rows of a shared part cancel out of a multiset difference); default the whole."""
    members = members or ("members", "p_members")
    kept = ", ".join(f'"{c}"' for c in COLUMN.values() if c in columns["members"])
    spans = 'record_id, record_offset, shard, block, start, "end"'
    statements = [
        *diff("mdiff", f"SELECT {kept} FROM {members[0]}", f"SELECT {kept} FROM {members[1]}"),
        *diff(
            "sdiff",
            f"SELECT {spans} FROM spanrows",
            f"SELECT {spans} FROM p_spanrows",
        ),
        "CREATE TABLE staging.rids AS SELECT DISTINCT record_id FROM staging.sdiff "
        "WHERE record_id IS NOT NULL",
    ]
    duplicates = f"verdict IN ({', '.join(repr(d) for d in DUPLICATES)})"
    changed = "IN (SELECT record_id FROM staging.rids)"
    carried = "verdict" in columns["clusters"]
    if carried:
        picked = [c for c in COLUMN.values() if c in columns["clusters"]]
        cols = ", ".join(f'"{c}"' for c in dict.fromkeys([*picked, "verdict", *CARRIED]))
        child = f"SELECT {cols} FROM clusters WHERE {duplicates}"
        statements += diff("cdiff", child, child.replace("FROM clusters", "FROM p_clusters"))
    targets = []  # (kind, target, the facts of it a source's change reaches)
    for kind in sorted(COLUMN):
        col = COLUMN[kind]
        if col not in columns["members"]:
            continue
        sources = [("staging.mdiff", "member"), (f"members WHERE record_id {changed}", None)]
        if carried and col in columns["clusters"]:
            reps = f"clusters WHERE {duplicates} AND representative_id {changed}"
            sources += [("staging.cdiff", "carried"), (reps, None)]
        for source, fact in sources:
            facts = f"['{fact}', 'spans']" if fact else "['spans']"
            targets.append(
                f"SELECT '{kind}' AS kind, CAST({col} AS VARCHAR) AS target, "
                f"unnest({facts}) AS fact FROM {source}"
            )
    union = " UNION ALL ".join(f"({t})" for t in targets)
    union = union or "SELECT NULL AS kind, NULL AS target, NULL AS fact"
    statements.append(
        "CREATE TABLE staging.targets AS SELECT DISTINCT kind, target, fact "
        f"FROM ({union}) WHERE target IS NOT NULL"
    )
    keys = (
        "SELECT 'span' || chr(0) || record_id AS key FROM staging.rids UNION ALL "
        "SELECT kind || chr(0) || target || chr(0) || fact FROM staging.targets"
    )
    return [*statements, f"CREATE TABLE staging.affected AS SELECT DISTINCT key FROM ({keys})"]


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


def kind_rows(kind: str, columns: dict[str, list[str]], narrow: bool = False) -> str:
    """The member, carried and spans rows of one kind's targets (a null target names nothing,
    its key is null); ``narrow``: of its affected targets only."""
    col = COLUMN[kind]
    if col not in columns["members"]:
        return "SELECT NULL AS key"
    members, clusters = "members", "clusters"
    if narrow:
        wanted = (
            f"CAST({col} AS VARCHAR) IN (SELECT target FROM staging.targets WHERE kind = '{kind}')"
        )
        members = f"(SELECT * FROM members WHERE {wanted})"
        clusters = f"(SELECT * FROM clusters WHERE {wanted})"

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
            f"SELECT {key('r.target', 'spans')}, {spans} FROM spanrows s JOIN "
            f"(SELECT DISTINCT target, rid FROM ({reached})) r ON s.record_id = r.rid"
        )
    return " UNION ALL BY NAME ".join(f"({p})" for p in parts)


def empty(names: list[str]) -> str:
    return "SELECT " + ", ".join(f'NULL AS "{n}"' for n in names) + " WHERE false"
