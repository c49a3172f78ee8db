//! Samplers (`src/sample/`): χ² tests of every distribution, epochs, refreshed indexes.

mod slice;
mod epoch;
mod refresh;
