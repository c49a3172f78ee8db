//! Ingest (`src/ingest/`): NumPy, Parquet (D4RL, Minari, LeRobot conventions), TorchRL, DQN
//! Replay (dopamine).

pub(crate) mod dqn;
mod numpy;
mod parquet;
mod torchrl;
