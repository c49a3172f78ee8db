//! Ingest (`src/ingest/`): NumPy (and directories of `.npz` shards: OGBench, episode files),
//! Parquet (D4RL, Minari, LeRobot conventions), TorchRL, DQN Replay (dopamine), RLDS (TFDS),
//! LeRobot's image features (PNG bytes in Parquet) and camera videos (feature `video`).

pub(crate) mod dqn;
pub(crate) mod lerobot_images;
#[cfg(feature = "video")]
mod lerobot_video;
pub(crate) mod npz_dir;
pub(crate) mod numpy;
mod parquet;
mod rlds;
mod torchrl;
mod unstack;
