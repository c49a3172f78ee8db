//! SQL (`src/sql/`): queries against DuckDB and NumPy references, plans, refusals, the sizes of frames.

mod frames;
mod queries;
