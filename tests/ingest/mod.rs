//! Ingest (`src/ingest/`): NumPy, Parquet (D4RL, Minari, LeRobot conventions), TorchRL, DQN
//! Replay (dopamine), RLDS (TFDS).

pub(crate) mod dqn;
pub(crate) mod numpy;
mod parquet;
mod rlds;
mod torchrl;
mod unstack;
