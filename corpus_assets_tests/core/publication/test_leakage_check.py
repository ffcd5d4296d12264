"""The leakage components the gate finds: only rows joined to another are graph vertices, an
edge joins its ids' first live rows, and the findings are those of the graph over every live
row."""

import random

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from corpus_assets.core.publication import leakage_check
from corpus_assets.core.publication.leakage_check import leaked_components, register_dropped
from corpus_assets.core.training_view.leakage_graph import component_labels

EVERY_GROUP = """
WITH numbered AS (SELECT group_id, row_number() OVER () - 1 AS g
                  FROM (SELECT DISTINCT group_id FROM dd_live))
SELECT l.v, n.g FROM dd_live l JOIN numbered n ON l.group_id IS NOT DISTINCT FROM n.group_id
"""
# the reference graph's tables: every live row with its leakage id, each edge end at its
# record id's first live row (a table of each id's first row), every component named
LIVE = """
CREATE OR REPLACE TEMP TABLE dd_live AS
WITH dropped AS (
    SELECT record_id FROM dd_dropped
    UNION SELECT record_id FROM dd_clusters
    WHERE NOT is_representative AND representative_id IN (SELECT record_id FROM dd_dropped))
SELECT record_id, group_id, leakage_id, ord AS v
FROM dd_clusters
WHERE verdict <> 'excluded' AND record_id NOT IN (SELECT record_id FROM dropped)
"""
LEAKS = """
WITH cm AS (SELECT l.record_id, l.leakage_id, c.component FROM dd_live l JOIN dd_comp c USING (v)),
per AS (SELECT cm.component, m.split, count(*) AS n
        FROM cm JOIN members m USING (record_id) GROUP BY cm.component, m.split),
wide AS (SELECT component FROM per GROUP BY component HAVING count(*) > 1),
named AS (SELECT component, min(leakage_id) AS lid FROM cm
          WHERE component IN (SELECT component FROM wide) GROUP BY component)
SELECT any_value(named.lid), string_agg(per.split || ' (' || per.n || ')', ', ' ORDER BY per.split)
FROM per JOIN named USING (component) GROUP BY component ORDER BY component
"""
FIRST_ROWS = """
WITH first AS (SELECT record_id, min(v) AS v FROM dd_live GROUP BY record_id)
SELECT a.v AS a, b.v AS b FROM dd_edges e
JOIN first a ON e.record_a = a.record_id JOIN first b ON e.record_b = b.record_id
"""


def _every_row(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The findings over a graph of every live row and every group (the reference)."""
    con.execute(LIVE)
    found = con.execute(EVERY_GROUP).fetchnumpy()
    v, groups = (np.asarray(found[k], dtype=np.int64) for k in ("v", "g"))
    n = int(v.max()) + 1 if len(v) else 0
    pairs = con.execute(FIRST_ROWS).fetchnumpy()
    a, b = (np.asarray(pairs[k], dtype=np.int64) for k in ("a", "b"))
    size = n + (int(groups.max()) + 1 if len(groups) else 0)
    labels = component_labels(size, np.concatenate([v, a]), np.concatenate([n + groups, b]))
    component = labels[v]
    shared = np.bincount(component)[component] > 1
    con.register("dd_comp", pa.table({"v": v[shared], "component": component[shared]}))
    return [
        f"leakage group {lid!r} spans splits {spread}"
        for lid, spread in con.execute(LEAKS).fetchall()
    ]


def _connection(seed: int) -> duckdb.DuckDBPyConnection:
    """Random clusters (groups of one to a few rows, a null group, excluded rows, repeated ids),
    edges (some to no live row), members in three splits and a dropped record."""
    rng = random.Random(seed)
    ids = [f"r{rng.randrange(300)}" for _ in range(200)]
    groups = [rng.choice([None, *(f"g{k}" for k in range(150))]) for _ in ids]
    verdicts = [rng.choice(["kept"] * 6 + ["exact_duplicate", "excluded"]) for _ in ids]
    clusters = pa.table(
        {
            "record_id": ids,
            "group_id": pa.array(groups, pa.string()),
            "leakage_id": [f"L{n}" for n in range(len(ids))],
            "verdict": verdicts,
            "is_representative": [v == "kept" for v in verdicts],
            "representative_id": ids,
            "ord": pa.array(range(len(ids)), pa.int64()),
        }
    )
    pairs = [(f"r{rng.randrange(320)}", f"r{rng.randrange(320)}") for _ in range(40)]
    edges = pa.table({"record_a": [p[0] for p in pairs], "record_b": [p[1] for p in pairs]})
    kept = sorted(set(ids))[: len(set(ids)) * 3 // 4]
    splits = [rng.choice(["train"] * 8 + ["test", "validation"]) for _ in kept]
    con = duckdb.connect()
    con.register("dd_clusters", clusters)
    con.register("dd_edges", edges)
    con.register("members", pa.table({"record_id": kept, "split": splits}))
    register_dropped(con, [rng.choice(ids)])
    return con


def test_the_components_of_joined_rows_find_what_the_graph_of_every_row_finds() -> None:
    """Over random tables, the same findings in the same order; some of them leak."""
    leaking = 0
    for seed in range(40):
        with _connection(seed) as con:
            found = leaked_components(con)
            assert found == _every_row(con), seed
        leaking += bool(found)
    assert leaking > 5


def test_a_row_joined_to_no_other_is_no_vertex(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifty rows, each its own group but two sharing one and two joined by an edge: the graph
    holds those four rows and their one group (five vertices), not fifty rows and 49 groups."""
    seen: list[int] = []

    def counted(size: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        seen.append(size)
        return component_labels(size, rows, cols)

    monkeypatch.setattr(leakage_check, "min_labels", counted)
    ids = [f"r{n}" for n in range(50)]
    con = duckdb.connect()
    con.register(
        "dd_clusters",
        pa.table(
            {
                "record_id": ids,
                "group_id": ["g", "g", *ids[2:]],
                "leakage_id": ids,
                "verdict": ["kept"] * 50,
                "is_representative": [True] * 50,
                "representative_id": ids,
                "ord": pa.array(range(50), pa.int64()),
            }
        ),
    )
    con.register("dd_edges", pa.table({"record_a": ["r2"], "record_b": ["r3"]}))
    con.register("members", pa.table({"record_id": ids, "split": ["train", "test"] * 25}))
    register_dropped(con, [])
    found = leaked_components(con)
    assert found == [
        "leakage group 'r0' spans splits test (1), train (1)",
        "leakage group 'r2' spans splits test (1), train (1)",
    ]
    assert seen == [5]


@pytest.mark.parametrize("seed", range(8))
def test_min_labels_are_the_components_of_scipy_labelled_by_their_lowest_vertex(
    seed: int,
) -> None:
    """Random graphs (isolated vertices, stars, chains in shuffled order, self loops, repeated
    edges): the same partition as scipy's, each vertex labelled by its component's lowest."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 400))
    m = int(rng.integers(0, 300))
    a, b = rng.integers(0, size, m), rng.integers(0, size, m)
    chain = rng.permutation(size)[: size // 3]  # a long path, its edges shuffled
    order = rng.permutation(max(len(chain) - 1, 0))
    a = np.concatenate([a, chain[:-1][order], np.full(5, size - 1)])
    b = np.concatenate([b, chain[1:][order], rng.integers(0, size, 5)])
    labels = leakage_check.min_labels(size, a, b)
    reference = component_labels(size, a, b)
    lowest = np.full(size, size)
    np.minimum.at(lowest, reference, np.arange(size))  # each scipy component's lowest vertex
    assert np.array_equal(labels, lowest[reference])
