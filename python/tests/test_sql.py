"""ds.sql (DataFusion over the memory-mapped segments) gives what DuckDB computes over the same
Arrow files, read with pyarrow; episodes_where likewise."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

import trajstore

duckdb = pytest.importorskip("duckdb")


def _storage(table: pa.Table) -> pa.Table:
    """Extension columns (fixed_shape_tensor) as their storage (fixed-size lists), which DuckDB reads."""
    cols = []
    for c in table.columns:
        c = c.combine_chunks()
        if isinstance(c.type, pa.BaseExtensionType):
            c = c.storage
        cols.append(c)
    return pa.table(cols, names=table.column_names)


@pytest.fixture(scope="module")
def duck(ref):
    con = duckdb.connect()
    con.register("transitions", _storage(ref.transitions))
    # The `episodes` SQL table has no segment-local `row_start`.
    con.register("episodes", _storage(ref.episodes_table.drop_columns(["row_start"])))
    yield con
    con.close()


def _duck_rows(con, query):
    rel = con.sql(query)
    return [tuple(r) for r in rel.fetchall()], list(rel.columns)


def _close(a, b):
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def _compare(ds, con, query, min_rows=1):
    got = ds.sql(query)
    assert isinstance(got, pa.Table)
    want, names = _duck_rows(con, query)
    assert got.column_names == names
    rows = [tuple(r.values()) for r in got.to_pylist()]
    assert len(rows) == len(want) >= min_rows
    for g, w in zip(rows, want):
        assert _close(g, w), f"{query}\n trajstore {g}\n duckdb    {w}"
    return rows


QUERIES = [
    # Aggregates over episodes, grouped.
    "SELECT terminated, count(*) AS n, sum(length) AS steps, avg(episode_return) AS mean_ret, "
    "min(length) AS shortest, max(length) AS longest FROM episodes GROUP BY terminated ORDER BY terminated",
    # Per-episode aggregates over transitions.
    "SELECT episode_id, count(*) AS n, sum(reward) AS ret, min(step) AS first, max(step) AS last, "
    "sum(CASE WHEN is_last THEN 1 ELSE 0 END) AS lasts FROM transitions GROUP BY episode_id ORDER BY episode_id",
    # A join of both tables.
    "SELECT e.terminated, count(*) AS n, avg(t.reward) AS r FROM transitions t JOIN episodes e "
    "ON t.episode_id = e.episode_id GROUP BY e.terminated ORDER BY e.terminated",
    # Filters, HAVING, ORDER BY and LIMIT.
    "SELECT episode_id, length, episode_return FROM episodes WHERE length > 150 "
    "ORDER BY episode_return DESC, episode_id LIMIT 10",
    "SELECT episode_id, count(*) AS n FROM transitions WHERE reward > 0.9 AND NOT is_first "
    "GROUP BY episode_id HAVING count(*) > 3 ORDER BY n DESC, episode_id",
    # Elements of a tensor column (1-based in both engines).
    "SELECT episode_id, observation[1] AS o1, observation[17] AS o17, action[6] AS a6 FROM transitions "
    "WHERE step = 0 ORDER BY episode_id",
    "SELECT count(*) AS n, sum(reward) AS total, min(reward) AS lo, max(reward) AS hi FROM transitions",
    "SELECT truncated, terminated, count(*) AS n FROM transitions WHERE is_last GROUP BY truncated, terminated "
    "ORDER BY truncated, terminated",
]


@pytest.mark.parametrize("query", QUERIES)
def test_sql_equals_duckdb(demo_ds, duck, query):
    _compare(demo_ds, duck, query)


def test_sql_agrees_with_numpy_reference(demo_ds, ref):
    """The numbers themselves, from the files: per-episode returns and lengths."""
    t = demo_ds.sql("SELECT episode_id, count(*) AS n, sum(reward) AS ret FROM transitions GROUP BY episode_id ORDER BY episode_id")
    ids = t.column("episode_id").to_pylist()
    assert ids == ref.episode_ids
    for eid, n, ret in zip(ids, t.column("n").to_pylist(), t.column("ret").to_pylist()):
        e = ref.episodes[eid]
        assert n == e.length
        r = ref.steps(eid, "reward").astype(np.float64).sum()
        assert ret == pytest.approx(r, rel=1e-9, abs=1e-9)
        assert e.ret == pytest.approx(r, rel=1e-6, abs=1e-6)


def test_sql_tensor_functions_match_numpy(demo_ds, ref):
    t = demo_ds.sql("SELECT dim_mean(observation) AS m FROM transitions")
    np.testing.assert_allclose(np.array(t.column("m").to_pylist()[0]), ref.columns["observation"].astype(np.float64).mean(0), rtol=1e-9, atol=1e-12)
    g = demo_ds.sql(
        "SELECT episode_id, discounted_return(reward, step, 0.9) AS g FROM transitions "
        "WHERE episode_id < 5 GROUP BY episode_id ORDER BY episode_id"
    )
    for eid, got in zip(g.column("episode_id").to_pylist(), g.column("g").to_pylist()):
        r = ref.steps(eid, "reward").astype(np.float64)
        assert got == pytest.approx(float((0.9 ** np.arange(len(r)) * r).sum()), rel=1e-9)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT episode_id FROM episodes WHERE episode_return > 150 AND terminated",
        "SELECT episode_id FROM transitions WHERE reward > 0.95",  # duplicates, unordered
        "SELECT episode_id FROM episodes WHERE length BETWEEN 20 AND 60 ORDER BY episode_return DESC",
    ],
)
def test_episodes_where_equals_duckdb(demo_ds, duck, query):
    got = demo_ds.episodes_where(query)
    assert isinstance(got, np.ndarray) and got.dtype == np.int64 and got.ndim == 1
    want = sorted({int(r[0]) for r in duck.sql(query).fetchall()})
    assert len(want) > 0
    assert got.tolist() == want  # sorted and distinct


def test_episodes_where_empty(demo_ds):
    got = demo_ds.episodes_where("SELECT episode_id FROM episodes WHERE length > 100000")
    assert got.dtype == np.int64 and got.shape == (0,)


def test_sql_is_read_only_unless_allowed(demo_ds, tmp_path):
    out = tmp_path / "lengths.csv"
    q = f"COPY (SELECT episode_id, length FROM episodes ORDER BY episode_id) TO '{out}' STORED AS CSV"
    with pytest.raises(trajstore.InvalidArgumentError):
        demo_ds.sql(q)
    assert not out.exists()
    demo_ds.sql(q, allow_writes=True)
    lines = out.read_text().split()
    assert lines[0] == "episode_id,length"
    lengths = demo_ds.episodes().column("length").to_pylist()
    assert [tuple(map(int, l.split(","))) for l in lines[1:]] == list(enumerate(lengths))


@pytest.mark.parametrize("query", ["SELEC 1", "SELECT nope FROM episodes", "SELECT * FROM no_such_table"])
def test_sql_errors(demo_ds, query):
    with pytest.raises(trajstore.SqlError) as e:
        demo_ds.sql(query)
    assert isinstance(e.value, ValueError) and isinstance(e.value, trajstore.TrajstoreError)
