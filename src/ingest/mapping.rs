//! How an input's columns become a dataset's: the [`Mapping`] of observations, actions, rewards,
//! episode boundaries and user columns, resolved from the options and the input's schema.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};

use super::unstack::Unstack;
use super::*;
use crate::error::{Error, Result};
use crate::format::{self, col};
use crate::schema::{TransitionSchema, field_shape, fsl, tensor_field};

// ---------------------------------------------------------------------------------------------
// The plan: which input column becomes which stored column, and how.
// ---------------------------------------------------------------------------------------------

/// A tensor column (observation, continuous action, next observation) built from one or more
/// input columns, concatenated per row.
#[derive(Debug, Clone)]
pub(crate) struct TensorSpec {
    /// Input column and its number of values per row.
    pub(crate) sources: Vec<(String, usize)>,
    /// Element type after conversion.
    pub(crate) elem: DataType,
    /// Tensor shape (product = sum of the widths).
    shape: Vec<usize>,
}

impl TensorSpec {
    pub(crate) fn width(&self) -> usize {
        self.sources.iter().map(|s| s.1).sum()
    }
}

#[derive(Debug, Clone)]
pub(crate) enum ActionSpec {
    Discrete(String),
    Continuous(TensorSpec),
}

#[derive(Debug, Clone)]
pub(crate) struct EpisodeCol {
    pub(crate) name: String,
    pub(crate) signed: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Mapping {
    pub(crate) schema: TransitionSchema,
    /// Root column indices to decode.
    pub(crate) projection: Vec<usize>,
    pub(crate) observation: TensorSpec,
    pub(crate) action: ActionSpec,
    /// `None`: no reward in the input, 0.0 is stored.
    pub(crate) reward: Option<String>,
    pub(crate) next_observation: Option<TensorSpec>,
    pub(crate) episode: Option<EpisodeCol>,
    pub(crate) terminated: Option<String>,
    pub(crate) truncated: Option<String>,
    /// `--unstack K`: how converted stacks become frames (`schema` is then the stored one).
    pub(crate) unstack: Option<Unstack>,
    /// Each episode's last input row is the state after its last step, not a transition: its
    /// observation is the episode's final observation ([`Convention::Ogbench`],
    /// [`Convention::EpisodeFiles`]).
    pub(crate) final_row: bool,
    /// The convention of `.npz` inputs, as reported.
    pub(crate) convention: Option<ConventionReport>,
    /// Kept columns of encoded images (PNG or JPEG bytes, e.g. LeRobot's `image` features):
    /// name and stored shape (`[H, W]` or `[H, W, C]`, from row 0), decoded at conversion.
    pub(crate) images: Vec<(String, Vec<usize>)>,
}

/// The shape of one input column.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// One number per row.
    Scalar(DataType),
    /// A (possibly nested) fixed-size list of numbers: element type, shape.
    Fixed(DataType, Vec<usize>),
    /// A variable-size list of numbers.
    List(DataType),
}

impl Kind {
    fn elem(&self) -> &DataType {
        match self {
            Kind::Scalar(e) | Kind::Fixed(e, _) | Kind::List(e) => e,
        }
    }
}

pub(crate) fn is_numeric(dt: &DataType) -> bool {
    dt.is_integer() || dt.is_floating()
}

/// Classifies a column as a numeric scalar, fixed-size list or list; `None` otherwise.
pub(crate) fn kind_of(field: &Field) -> Option<Kind> {
    match field.data_type() {
        dt if is_numeric(dt) => Some(Kind::Scalar(dt.clone())),
        DataType::FixedSizeList(child, n) => {
            let n = usize::try_from(*n).ok().filter(|&n| n > 0)?;
            match kind_of(child)? {
                Kind::Scalar(e) => {
                    // A flat list may carry `arrow.fixed_shape_tensor` metadata (e.g. our export).
                    let shape = field_shape(field).unwrap_or_else(|_| vec![n]);
                    Some(Kind::Fixed(e, shape))
                }
                Kind::Fixed(e, inner) => {
                    let mut shape = vec![n];
                    shape.extend(inner);
                    Some(Kind::Fixed(e, shape))
                }
                Kind::List(_) => None,
            }
        }
        DataType::List(child) | DataType::LargeList(child) if is_numeric(child.data_type()) => {
            Some(Kind::List(child.data_type().clone()))
        }
        _ => None,
    }
}

/// Reserved names a leftover input column may not take.
pub(crate) fn reserved(name: &str) -> bool {
    col::BOUNDARY.contains(&name)
        || [
            col::OBSERVATION,
            col::ACTION,
            col::REWARD,
            col::NEXT_OBSERVATION,
        ]
        .contains(&name)
}

/// Why a leftover column with a reserved name cannot be kept, and what to do instead.
pub(crate) fn reserved_error(name: &str) -> Error {
    let role = match name {
        col::TERMINATED | col::TRUNCATED | col::OBSERVATION | col::ACTION | col::REWARD => name,
        col::NEXT_OBSERVATION => "next-observation",
        _ => "",
    };
    let fix = if role.is_empty() {
        format!(
            "the store computes `{name}` itself; pass --drop-cols {name} (or --episode-col {name} if it holds episode ids)"
        )
    } else {
        format!("use it with --{role}-col {name}, or pass --drop-cols {name}")
    };
    Error::schema(
        name,
        format!(
            "the column would be kept as a user column, but its name is reserved for a stored \
             column; {fix}"
        ),
    )
}

/// The user-column type of an input column, if it is fixed-width: fixed-size list children are
/// renamed to a non-nullable `item`.
pub(crate) fn user_type(dt: &DataType) -> Option<DataType> {
    let out = match dt {
        DataType::FixedSizeList(child, n) => DataType::FixedSizeList(
            Field::new("item", child.data_type().clone(), false).into(),
            *n,
        ),
        other => other.clone(),
    };
    // Only types that survive the manifest round trip.
    format::parse_type(&format::type_name(&out)?).ok()?;
    Some(out)
}

impl Mapping {
    /// What an ingest that used this plan reports.
    pub(crate) fn report(
        &self,
        rows: u64,
        episodes: u64,
        version: u64,
        started: Instant,
    ) -> IngestReport {
        IngestReport {
            rows,
            episodes,
            version,
            seconds: started.elapsed().as_secs_f64(),
            columns: self.mapping(),
            boundaries: self.boundaries(),
            convention: self.convention.clone(),
        }
    }

    /// [`Mapping::build_unnamed`], with the input named in its errors.
    pub(crate) fn build(source: &dyn Source, opts: &IngestOptions) -> Result<Mapping> {
        let name = source.path().display().to_string();
        Self::build_unnamed(source, opts).map_err(|e| match e {
            Error::SchemaMismatch {
                column,
                expected,
                found,
                reason,
            } if !reason.contains(&name) => Error::SchemaMismatch {
                column,
                expected,
                found,
                reason: format!("{name}: {reason}"),
            },
            Error::InvalidData { input: None, .. } => e.in_input(name),
            e => e,
        })
    }

    fn build_unnamed(source: &dyn Source, opts: &IngestOptions) -> Result<Mapping> {
        let input = source.path();
        let file_schema = source.schema();
        let convention = source.convention();
        let opts = &resolve_conventions(
            opts,
            &file_schema,
            source.episode_column(),
            convention.as_ref().map(|c| c.convention),
        );
        let final_row = convention.as_ref().is_some_and(|c| {
            matches!(c.convention, Convention::Ogbench | Convention::EpisodeFiles)
        });
        if opts.batch_rows == 0 {
            return Err(Error::argument("batch_rows", "must be at least 1"));
        }
        if opts.episode_col.is_none()
            && opts.terminated_col.is_none()
            && opts.truncated_col.is_none()
        {
            return Err(Error::invalid_argument(
                "no way to find episode boundaries: give an episode id column (--episode-col NAME; an \
                 episode is a run of equal ids, optional flag columns are read on its last row), or \
                 flag columns (--terminated-col NAME and/or --truncated-col NAME; an episode ends at a \
                 row where either is set)",
            ));
        }
        let mut seen = HashSet::new();
        for f in file_schema.fields() {
            if !seen.insert(f.name().as_str()) {
                return Err(Error::schema(
                    f.name(),
                    format!("{} has two columns of this name", input.display()),
                ));
            }
        }
        let all_names = || crate::schema::names(&file_schema);
        // Every input column used, with the role it plays (to reject double use).
        let mut used: Vec<(String, &'static str)> = vec![];
        let mut take = |name: &str, role: &'static str, flag: &str| -> Result<FieldRef> {
            if let Some((_, other)) = used.iter().find(|(n, _)| n == name) {
                return Err(Error::invalid_argument(format!(
                    "column `{name}` is used both as {other} and as {role}"
                )));
            }
            if opts.drop_cols.iter().any(|d| d == name) {
                return Err(Error::invalid_argument(format!(
                    "column `{name}` is used as {role} and also listed in --drop-cols"
                )));
            }
            let field = file_schema.field_with_name(name).map_err(|_| {
                Error::schema(
                    name,
                    format!(
                        "{} has no such column for the {role} (set it with {flag}); columns: {}",
                        input.display(),
                        all_names()
                    ),
                )
            })?;
            used.push((name.to_string(), role));
            Ok(Arc::new(field.clone()))
        };

        // Episode boundaries.
        let episode = match &opts.episode_col {
            Some(name) => {
                let f = take(name, "episode id", "--episode-col")?;
                if !f.data_type().is_integer() {
                    return Err(Error::schema_types(
                        name,
                        "an integer type",
                        f.data_type(),
                        "the episode id column must hold integers",
                    ));
                }
                Some(EpisodeCol {
                    name: name.clone(),
                    signed: f.data_type().is_signed_integer(),
                })
            }
            None => None,
        };
        let mut flag =
            |name: &Option<String>, role: &'static str, opt: &str| -> Result<Option<String>> {
                let Some(name) = name else { return Ok(None) };
                let f = take(name, role, opt)?;
                let dt = f.data_type();
                if !(dt == &DataType::Boolean || is_numeric(dt)) {
                    return Err(Error::schema_types(
                        name,
                        "bool or a number",
                        dt,
                        format!("the {role} column must be bool or numeric (non-zero = set)"),
                    ));
                }
                Ok(Some(name.clone()))
            };
        let terminated = flag(&opts.terminated_col, "terminated flag", "--terminated-col")?;
        let truncated = flag(&opts.truncated_col, "truncated flag", "--truncated-col")?;

        // Tensors: collect their kinds first; lengths of variable-size lists come from row 0.
        let mut tensor_kinds =
            |names: Vec<String>, role: &'static str, opt: &str| -> Result<Vec<(String, Kind)>> {
                names
                    .into_iter()
                    .map(|name| {
                        let f = take(&name, role, opt)?;
                        let kind = kind_of(&f).ok_or_else(|| {
                        Error::schema_types(
                            &name,
                            "numbers or (fixed-size) lists of numbers",
                            f.data_type(),
                            format!(
                                "the {role} column must be numbers or (fixed-size) lists of numbers"
                            ),
                        )
                    })?;
                        Ok((name, kind))
                    })
                    .collect()
            };
        let obs_names = if opts.observation_cols.is_empty() {
            vec![opts.observation_col.clone()]
        } else {
            opts.observation_cols.clone()
        };
        let obs_opt = if opts.observation_cols.is_empty() {
            "--observation-col"
        } else {
            "--observation-cols"
        };
        let obs_kinds = tensor_kinds(obs_names, "observation", obs_opt)?;
        let act_names = if opts.action_cols.is_empty() {
            vec![opts.action_col.clone()]
        } else {
            opts.action_cols.clone()
        };
        let act_opt = if opts.action_cols.is_empty() {
            "--action-col"
        } else {
            "--action-cols"
        };
        let act_kinds = tensor_kinds(act_names, "action", act_opt)?;
        let next_kinds = match &opts.next_observation_col {
            Some(n) => Some(tensor_kinds(
                vec![n.clone()],
                "next observation",
                "--next-observation-col",
            )?),
            None => None,
        };
        let reward = if opts.no_reward {
            None
        } else {
            if file_schema.field_with_name(&opts.reward_col).is_err() {
                return Err(Error::schema(
                    &opts.reward_col,
                    format!(
                        "{} has no such column for the reward (set it with --reward-col, or pass \
                         --no-reward if the data has none, e.g. demonstrations); columns: {}",
                        input.display(),
                        all_names()
                    ),
                ));
            }
            let reward_field = take(&opts.reward_col, "reward", "--reward-col")?;
            if !is_numeric(reward_field.data_type()) {
                return Err(Error::schema_types(
                    &opts.reward_col,
                    "a number",
                    reward_field.data_type(),
                    "the reward column must be a number",
                ));
            }
            Some(opts.reward_col.clone())
        };

        let list_cols: Vec<&str> = obs_kinds
            .iter()
            .chain(&act_kinds)
            .chain(next_kinds.iter().flatten())
            .filter(|(_, k)| matches!(k, Kind::List(_)))
            .map(|(n, _)| n.as_str())
            .collect();
        let lengths = source.first_row_lengths(&list_cols)?;
        let width_of = |name: &str, kind: &Kind| -> usize {
            match kind {
                Kind::Scalar(_) => 1,
                Kind::Fixed(_, shape) => shape.iter().product(),
                Kind::List(_) => lengths.iter().find(|(n, _)| n == name).map_or(0, |l| l.1),
            }
        };
        let tensor = |kinds: &[(String, Kind)], force_float: bool| -> TensorSpec {
            let sources: Vec<(String, usize)> = kinds
                .iter()
                .map(|(n, k)| (n.clone(), width_of(n, k)))
                .collect();
            let first = kinds[0].1.elem().clone();
            let mut elem = if kinds.iter().all(|(_, k)| k.elem() == &first) {
                first
            } else {
                DataType::Float32
            };
            if force_float && !elem.is_floating() {
                elem = DataType::Float32;
            }
            let width = sources.iter().map(|s| s.1).sum();
            let shape = match kinds {
                [(_, Kind::Fixed(_, shape))] => shape.clone(),
                _ => vec![width],
            };
            TensorSpec {
                sources,
                elem,
                shape,
            }
        };

        let observation = tensor(&obs_kinds, false);
        let action = match act_kinds.as_slice() {
            [(name, Kind::Scalar(dt))] if dt.is_integer() => ActionSpec::Discrete(name.clone()),
            kinds => {
                let mut spec = tensor(kinds, true);
                spec.shape = vec![spec.width()];
                ActionSpec::Continuous(spec)
            }
        };
        let next_observation = match next_kinds {
            Some(kinds) => {
                let mut spec = tensor(&kinds, false);
                if spec.elem != observation.elem || spec.width() != observation.width() {
                    return Err(Error::schema_types(
                        &spec.sources[0].0,
                        format!(
                            "{} values of {} per row",
                            observation.width(),
                            observation.elem
                        ),
                        format!("{} values of {} per row", spec.width(), spec.elem),
                        "the next observation column must hold what the observation holds",
                    ));
                }
                spec.shape = observation.shape.clone();
                Some(spec)
            }
            None => None,
        };

        // Payload fields in canonical order; `source_episode` leads the user columns.
        let mut fields = vec![
            tensor_field(
                col::OBSERVATION,
                observation.elem.clone(),
                &observation.shape,
                false,
            )?,
            match &action {
                ActionSpec::Discrete(_) => Field::new(col::ACTION, DataType::Int64, false),
                ActionSpec::Continuous(spec) => {
                    Field::new(col::ACTION, fsl(spec.elem.clone(), spec.width())?, false)
                }
            },
            Field::new(col::REWARD, DataType::Float32, false),
        ];
        if next_observation.is_some() {
            fields.push(tensor_field(
                col::NEXT_OBSERVATION,
                observation.elem.clone(),
                &observation.shape,
                false,
            )?);
        }
        if let Some(e) = &episode {
            let dt = if e.signed {
                DataType::Int64
            } else {
                DataType::UInt64
            };
            fields.push(Field::new(SOURCE_EPISODE, dt, false));
        }

        // Everything else is kept as a user column, or dropped.
        for d in &opts.drop_cols {
            if file_schema.field_with_name(d).is_err() {
                return Err(Error::argument(
                    "drop_cols",
                    format!(
                        "`{d}` (in --drop-cols) is not a column of {}; columns: {}",
                        input.display(),
                        all_names()
                    ),
                ));
            }
        }
        // Kept columns of encoded images: their shape is row 0's.
        let image_cols: Vec<&str> = file_schema
            .fields()
            .iter()
            .filter(|f| {
                crate::ingest::image::is_encoded_type(f.data_type())
                    && !opts.drop_cols.iter().any(|d| d == f.name())
                    && !used.iter().any(|(n, _)| n == f.name())
            })
            .map(|f| f.name().as_str())
            .collect();
        let mut images = vec![];
        if !image_cols.is_empty()
            && let Some(row0) = source.first_row(&image_cols)?
        {
            for name in &image_cols {
                let Some(bytes) = row0
                    .column_by_name(name)
                    .and_then(|a| crate::ingest::image::bytes_at(a.as_ref(), 0))
                else {
                    continue;
                };
                let probe = crate::ingest::image::probe(bytes, crate::ingest::image::MAX_SIDE);
                match (probe, file_schema.field_with_name(name)?.data_type()) {
                    (Ok((h, w, c)), _) => {
                        images.push((name.to_string(), crate::ingest::image::shape_of(h, w, c)))
                    }
                    // A plain binary column that is not an image is refused below, as before.
                    (Err(_), DataType::Binary | DataType::LargeBinary | DataType::BinaryView) => {}
                    (Err(e), _) => {
                        return Err(Error::invalid_data(format!(
                            "row 0 does not hold an image: {e}"
                        ))
                        .in_column(*name));
                    }
                }
            }
        }
        let mut projection = vec![];
        for (i, f) in file_schema.fields().iter().enumerate() {
            let name = f.name().as_str();
            if opts.drop_cols.iter().any(|d| d == name) {
                continue;
            }
            projection.push(i);
            if used.iter().any(|(n, _)| n == name) {
                continue;
            }
            if reserved(name) || (episode.is_some() && name == SOURCE_EPISODE) {
                return Err(reserved_error(name));
            }
            if let Some((_, shape)) = images.iter().find(|(n, _)| n == name) {
                fields.push(match opts.frame_codec {
                    Some(codec) => crate::schema::frame_field(
                        name,
                        &crate::frames::FrameSpec::new(codec, shape)?,
                        false,
                    )?,
                    None => crate::schema::tensor_field(name, DataType::UInt8, shape, false)?,
                });
                continue;
            }
            let dt = user_type(f.data_type()).ok_or_else(|| {
                Error::schema_types(
                    name,
                    "a fixed-width type (bool, ints, floats or fixed-size lists of numbers)",
                    f.data_type(),
                    format!(
                        "only fixed-width columns can be stored; pass --drop-cols {name} to \
                         ignore it"
                    ),
                )
            })?;
            fields.push(Field::new(name, dt, f.is_nullable()));
        }
        let mut schema = TransitionSchema::from_payload(&Schema::new(fields))?;
        let unstack = match opts.unstack {
            Some(k) => {
                let (u, stored) = Unstack::new(k, schema)?;
                schema = stored;
                Some(u)
            }
            None => None,
        };
        if let Some(codec) = opts.frame_codec
            && is_image(&schema)
        {
            let mut fields: Vec<Field> = schema
                .payload_schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            let spec = crate::frames::FrameSpec::new(codec, schema.observation_shape())?;
            fields[0] = crate::schema::frame_field(col::OBSERVATION, &spec, false)?;
            schema = TransitionSchema::from_payload(&Schema::new(fields))?;
        }
        Ok(Mapping {
            schema,
            projection,
            observation,
            action,
            reward,
            next_observation,
            episode,
            terminated,
            truncated,
            unstack,
            final_row,
            convention,
            images,
        })
    }

    /// The schema of converted chunks: the stored one, or with `--unstack` the stacked one.
    pub(crate) fn converted_schema(&self) -> &TransitionSchema {
        self.unstack.as_ref().map_or(&self.schema, |u| &u.stacked)
    }

    /// Stored column ← input column(s), where the names differ.
    fn mapping(&self) -> Vec<(String, String)> {
        let sources = |t: &TensorSpec| {
            t.sources
                .iter()
                .map(|s| s.0.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut out = vec![(col::OBSERVATION.to_string(), sources(&self.observation))];
        out.push((
            col::ACTION.to_string(),
            match &self.action {
                ActionSpec::Discrete(name) => name.clone(),
                ActionSpec::Continuous(t) => sources(t),
            },
        ));
        out.push((
            col::REWARD.to_string(),
            self.reward.clone().unwrap_or_else(|| "none (0.0)".into()),
        ));
        if let Some(t) = &self.next_observation {
            out.push((col::NEXT_OBSERVATION.to_string(), sources(t)));
        }
        if let Some(e) = &self.episode {
            out.push((SOURCE_EPISODE.to_string(), e.name.clone()));
        }
        for (name, shape) in &self.images {
            out.push((
                name.clone(),
                format!("{name} (encoded images, decoded to uint8 {shape:?})"),
            ));
        }
        out.retain(|(a, b)| a != b);
        out
    }

    /// Where episode boundaries come from, in words.
    fn boundaries(&self) -> String {
        let flags: Vec<&str> = [&self.terminated, &self.truncated]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        let convention = self.convention.as_ref().map(|c| c.convention);
        match (&self.episode, convention) {
            (None, Some(Convention::Ogbench)) => {
                return format!(
                    "OGBench trajectories: `{}` marks each one's last row, the state after its \
                     last step (stored as the final observation); episodes end truncated",
                    flags.join(", ")
                );
            }
            (Some(_), Some(Convention::EpisodeFiles)) => {
                let read = match flags.is_empty() {
                    true => "ending truncated".to_string(),
                    false => format!("flags {} read on its last step", flags.join(", ")),
                };
                return format!(
                    "one episode per file, its last observation the final observation ({read})"
                );
            }
            _ => {}
        }
        match &self.episode {
            Some(e) if flags.is_empty() => format!("episode ids in `{}`", e.name),
            Some(e) => format!(
                "episode ids in `{}` (flags {} on each episode's last row)",
                e.name,
                flags.join(", ")
            ),
            None => format!("flags {}", flags.join(", ")),
        }
    }

    /// Appending: the dataset's schema must match the inferred one (nullability of user columns
    /// aside: the dataset's wins, and nulls are checked row by row). The dataset's schema is then
    /// the one converted batches take.
    pub(crate) fn adopt(
        &mut self,
        existing: &TransitionSchema,
        input: &Path,
        dataset: &Path,
    ) -> Result<()> {
        let cannot = |why: &str| {
            format!(
                "cannot append {} to {}: {why}",
                input.display(),
                dataset.display()
            )
        };
        let mismatch = |why: String| Error::schema_mismatch(cannot(&why));
        let a = existing.payload_schema();
        let b = self.schema.payload_schema();
        let names = |s: &SchemaRef| {
            s.fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if a.fields().len() != b.fields().len() {
            return Err(mismatch(format!(
                "the file gives columns [{}], the dataset has [{}]",
                names(b),
                names(a)
            )));
        }
        for (x, y) in a.fields().iter().zip(b.fields()) {
            if x.name() == y.name() && x.data_type() != y.data_type() {
                return Err(Error::schema_types(
                    x.name(),
                    type_label(x.data_type()),
                    type_label(y.data_type()),
                    cannot("the file gives the column another type than the dataset has"),
                ));
            }
            if x.name() != y.name() {
                return Err(mismatch(format!(
                    "the file gives `{}: {}` where the dataset has `{}: {}`",
                    y.name(),
                    type_label(y.data_type()),
                    x.name(),
                    type_label(x.data_type())
                )));
            }
        }
        let (mine, theirs) = (
            self.schema.observation_shape(),
            existing.observation_shape(),
        );
        if mine.len() > 1 && mine != theirs {
            return Err(Error::schema_types(
                col::OBSERVATION,
                format!("shape {theirs:?}"),
                format!("shape {mine:?}"),
                cannot("the file gives observations of another shape than the dataset stores"),
            ));
        }
        self.schema = existing.clone();
        Ok(())
    }
}

/// Whether the observations of `schema` are images that ingest stores as a frame column: `uint8`,
/// `[H, W]` or channels-last `[H, W, C]` with `C <= 4`, `H` and `W` at least 8, and no stored
/// `next_observation`.
fn is_image(schema: &TransitionSchema) -> bool {
    let uint8 = matches!(schema.observation_field().data_type(),
        DataType::FixedSizeList(c, _) if c.data_type() == &DataType::UInt8);
    let shape = schema.observation_shape();
    let spatial = match shape {
        [h, w] => *h >= 8 && *w >= 8,
        [h, w, c] => *h >= 8 && *w >= 8 && *c <= 4,
        _ => false,
    };
    uint8 && spatial && !schema.has_next_observation()
}

pub(crate) fn type_label(dt: &DataType) -> String {
    format::type_name(dt).unwrap_or_else(|| dt.to_string())
}
