//! Ingest (`src/ingest/`): NumPy, Parquet (D4RL, Minari, LeRobot conventions), TorchRL.

mod numpy;
mod parquet;
mod torchrl;
