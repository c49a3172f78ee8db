//! Input conventions: the column names of D4RL, Minari, Gymnasium, LeRobot, TorchRL and
//! `trajstore export` files, recognised when the options leave a role at its default.

use arrow::datatypes::Schema;

use super::*;

/// Fills in what `opts` leaves at its defaults from the input's column names, so that common
/// layouts ingest without flags:
///
/// - `observations`, `actions`, `rewards`, `next_observations` (D4RL, Minari, most NumPy dumps),
///   TorchRL's `next/reward`, LeRobot's `observation.state` and `next.reward`, when the input has
///   no `observation`, `action`, `reward` column;
///   `next_observation(s)` and TorchRL's `next/observation` are stored as `next_observation`;
/// - episode boundaries, when no boundary option is given: flags `terminals`/`timeouts` (D4RL),
///   `terminated`/`truncated` (Gymnasium), `terminations`/`truncations` (Minari),
///   `next/terminated`/`next/truncated` (TorchRL; `next/done` is then dropped), else an episode
///   id column `episode_index` (LeRobot), `episode_id`, `episode`, `collector/traj_ids` or
///   `traj_ids` (TorchRL), else TorchRL's `next/done` alone as the terminated flag; a file written by
///   `trajstore export` (it has `episode_id, step, is_first, is_last`) takes its episode ids and
///   flags, and its computed `step, is_first, is_last` are dropped (the store recomputes them).
///
/// Columns named in `drop_cols` are never picked.
///
/// Under [`Convention::Ogbench`], `terminals` is the (truncated) end of each trajectory and,
/// without a `rewards` array, 0.0 is stored as the reward; under [`Convention::EpisodeFiles`]
/// the episodes are the files (`source_episodes`), with a terminated flag (`terminals`,
/// `terminated`, `terminations`) and a truncated one (`timeouts`, `truncated`, `truncations`)
/// read on each episode's last step.
pub(crate) fn resolve_conventions(
    opts: &IngestOptions,
    schema: &Schema,
    source_episodes: Option<&str>,
    convention: Option<Convention>,
) -> IngestOptions {
    let mut o = opts.clone();
    let has =
        |name: &str| schema.field_with_name(name).is_ok() && !o.drop_cols.iter().any(|d| d == name);
    let plural = |default: &str, set: &str, others: &[&str]| {
        if set != default || has(default) {
            return None;
        }
        others.iter().find(|n| has(n)).map(|n| n.to_string())
    };
    if o.observation_cols.is_empty()
        && let Some(p) = plural(
            col::OBSERVATION,
            &o.observation_col,
            &["observations", "observation.state"],
        )
    {
        o.observation_col = p;
    }
    if o.action_cols.is_empty()
        && let Some(p) = plural(col::ACTION, &o.action_col, &["actions"])
    {
        o.action_col = p;
    }
    if let Some(p) = plural(
        col::REWARD,
        &o.reward_col,
        &["rewards", "next/reward", "next.reward"],
    ) {
        o.reward_col = p;
    }
    if o.next_observation_col.is_none() {
        o.next_observation_col = ["next_observation", "next_observations", "next/observation"]
            .into_iter()
            .find(|n| has(n))
            .map(String::from);
    }
    let flags = [
        ("terminals", "timeouts"),
        (col::TERMINATED, col::TRUNCATED),
        ("terminations", "truncations"),
        ("next/terminated", "next/truncated"),
    ];
    match convention {
        Some(Convention::Ogbench) => {
            // The end of each trajectory: its last row is the final state, and the episode was
            // cut by a time limit.
            o.truncated_col = Some("terminals".into());
            if o.reward_col == col::REWARD && !has(col::REWARD) {
                o.no_reward = true;
            }
            return o;
        }
        Some(Convention::EpisodeFiles) => {
            o.episode_col = source_episodes.map(String::from);
            if o.terminated_col.is_none()
                && o.truncated_col.is_none()
                && let Some(&(t, tr)) = flags[..3].iter().find(|p| has(p.0) || has(p.1))
            {
                o.terminated_col = has(t).then(|| t.to_string());
                o.truncated_col = has(tr).then(|| tr.to_string());
            }
            return o;
        }
        _ => {}
    }
    let computed = [col::STEP, col::IS_FIRST, col::IS_LAST];
    let no_boundaries =
        o.episode_col.is_none() && o.terminated_col.is_none() && o.truncated_col.is_none();
    if let Some(id) = source_episodes.filter(|_| no_boundaries) {
        // The input's own episodes (Minari's groups), with its flags read on each last row.
        o.episode_col = Some(id.to_string());
        o.terminated_col = has("terminations").then(|| "terminations".to_string());
        o.truncated_col = has("truncations").then(|| "truncations".to_string());
        return o;
    }
    if !no_boundaries {
        // Giving one role explicitly does not switch off the others: the canonical flag names
        // are the flags, and the computed boundary columns of a trajstore export are recomputed.
        let taken = |o: &IngestOptions, n: &str| {
            [&o.episode_col, &o.terminated_col, &o.truncated_col]
                .iter()
                .any(|c| c.as_deref() == Some(n))
        };
        if o.terminated_col.is_none() && has(col::TERMINATED) && !taken(&o, col::TERMINATED) {
            o.terminated_col = Some(col::TERMINATED.to_string());
        }
        if o.truncated_col.is_none() && has(col::TRUNCATED) && !taken(&o, col::TRUNCATED) {
            o.truncated_col = Some(col::TRUNCATED.to_string());
        }
        if o.episode_col.is_some() && computed.iter().all(|c| has(c)) {
            o.drop_cols.extend(computed.iter().map(|c| c.to_string()));
        }
        return o;
    }
    {
        if has(col::EPISODE_ID) && computed.iter().all(|c| has(c)) {
            // A trajstore export: its own ids and flags; the computed columns are recomputed.
            o.episode_col = Some(col::EPISODE_ID.to_string());
            o.terminated_col = has(col::TERMINATED).then(|| col::TERMINATED.to_string());
            o.truncated_col = has(col::TRUNCATED).then(|| col::TRUNCATED.to_string());
            o.drop_cols.extend(computed.iter().map(|c| c.to_string()));
            return o;
        }
        if let Some((t, tr)) = flags.into_iter().find(|(t, tr)| has(t) || has(tr)) {
            o.terminated_col = has(t).then(|| t.to_string());
            o.truncated_col = has(tr).then(|| tr.to_string());
            // TorchRL's done is terminated OR truncated: nothing to keep.
            if t == "next/terminated" && has("next/done") {
                o.drop_cols.push("next/done".into());
            }
        } else if let Some(id) = [
            "episode_index",
            col::EPISODE_ID,
            "episode",
            "collector/traj_ids",
            "traj_ids",
        ]
        .into_iter()
        .find(|n| has(n))
        {
            o.episode_col = Some(id.into());
        } else if has("next/done") {
            // Older TorchRL data: done alone, read as terminated (the pre-truncation convention).
            o.terminated_col = Some("next/done".into());
        }
    }
    o
}
