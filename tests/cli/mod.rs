//! The `trajstore` binary (`src/bin/trajstore/`): exit codes, one-line errors, JSON output.

mod commands;
mod demo_frames;
