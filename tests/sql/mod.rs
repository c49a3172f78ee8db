//! SQL (`src/sql/`): queries against DuckDB and NumPy references, plans, refusals.

mod queries;
