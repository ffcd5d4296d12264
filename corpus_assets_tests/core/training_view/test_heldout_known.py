"""``known_jaccards``: each pair of rows gets the Jaccard a table holds for its two text digests
(in either order), 1.0 for two rows of one text, nan otherwise - with rows named many times, as
a held-out record is by the members it pairs with."""

import numpy as np
import pyarrow as pa

from corpus_assets.core.storage import cas_queries
from corpus_assets.core.training_view.splits.heldout_known import known_jaccards


def test_each_pair_gets_its_digests_jaccard_whatever_the_order_and_repeats() -> None:
    con = cas_queries.connect("64MB", 1)
    con.execute(
        "CREATE TEMP TABLE known AS SELECT * FROM (VALUES "
        "('d0', 'd1', 0.5), ('d1', 'd3', 0.75), ('d2', 'd3', 0.25)) t(a, b, jaccard)"
    )
    digests = pa.array(["d0", "d1", "d2", "d3", "d1"])  # rows 1 and 4: one text
    a = np.array([0, 3, 3, 1, 4, 2, 0, 1])
    b = np.array([1, 1, 4, 4, 1, 0, 2, 3])
    found = known_jaccards(con, ("known",), digests, a, b)
    expected = [0.5, 0.75, 0.75, 1.0, 1.0, np.nan, np.nan, 0.75]
    np.testing.assert_array_equal(found, np.array(expected))
    con.close()


class _Counted:
    """Digests by row that count the rows taken (as ``RowDigests`` reads them)."""

    def __init__(self, digests: pa.Array) -> None:
        self.digests, self.taken = digests, 0

    def take(self, rows: pa.Array) -> pa.Array:
        self.taken += len(rows)
        return self.digests.take(rows)


def test_each_rows_digest_is_taken_once_however_many_pairs_name_it() -> None:
    con = cas_queries.connect("64MB", 1)
    con.execute("CREATE TEMP TABLE known AS SELECT 'h' AS a, 'm1' AS b, 0.5 AS jaccard")
    digests = _Counted(pa.array(["h", *(f"m{n}" for n in range(1, 200))]))
    members = np.arange(1, 200)
    found = known_jaccards(con, ("known",), digests, np.zeros(199, np.int64), members)
    assert found[0] == 0.5 and np.isnan(found[1:]).all()
    assert digests.taken == 200  # not 2 x 199
    con.close()


def test_rows_without_a_digest_are_never_known() -> None:
    """Two rows without a text digest are not one text (SQL: NULL is not equal to NULL), and a
    table's row cannot name them."""
    con = cas_queries.connect("64MB", 1)
    con.execute("CREATE TEMP TABLE known AS SELECT 'd0' AS a, 'd1' AS b, 0.5 AS jaccard")
    digests = pa.array(["d1", None, None, "d0"])
    found = known_jaccards(con, ("known",), digests, np.array([1, 0, 3]), np.array([2, 1, 0]))
    np.testing.assert_array_equal(found, np.array([np.nan, np.nan, 0.5]))
    con.close()


def test_the_smallest_of_the_tables_jaccards_is_taken_and_pairs_are_in_byte_order() -> None:
    """Several tables (or rows) naming one pair give their smallest Jaccard (the SQL ``min``
    the lookup replaced); a table row out of byte order (``a > b``) names no pair."""
    con = cas_queries.connect("64MB", 1)
    con.execute(
        "CREATE TEMP TABLE known AS SELECT * FROM (VALUES "
        "('d0', 'd1', 0.5), ('d1', 'd3', 0.75)) t(a, b, jaccard)"
    )
    con.execute(
        "CREATE TEMP TABLE other AS SELECT * FROM (VALUES "
        "('d0', 'd1', 0.4), ('d0', 'd1', 0.45), ('d3', 'd2', 0.1)) t(a, b, jaccard)"
    )
    digests = pa.array(["d1", "d0", "d2", "d3"])
    a, b = np.array([0, 1, 2, 3]), np.array([1, 0, 3, 0])
    found = known_jaccards(con, ("known", "other"), digests, a, b)
    np.testing.assert_array_equal(found, np.array([0.4, 0.4, np.nan, 0.75]))
    con.close()
