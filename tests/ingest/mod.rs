//! Ingest (`src/ingest/`): NumPy, Parquet (D4RL, Minari, LeRobot conventions), TorchRL, DQN
//! Replay (dopamine).

pub(crate) mod dqn;
pub(crate) mod numpy;
mod parquet;
mod torchrl;
mod unstack;
