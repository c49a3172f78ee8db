//! Samplers (`src/sample/`): χ² tests of every distribution, epochs, refreshed indexes.

mod epoch;
mod refresh;
mod slice;
