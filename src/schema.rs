//! The transition schema: boundary columns, observation/action/reward, optional columns, and the
//! episode-table schema derived from it. Validation of schemas read from disk or given by users.
//! The observation is a tensor column, or a frame column (pixels, one compressed image per row,
//! [`crate::frames`]) whose stored type differs from what a writer is given (raw `uint8`
//! tensors, [`TransitionSchema::input_schema`]).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::{self, col, ep, meta};
use crate::frames::{FrameCodec, FrameSpec};

/// How actions are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionKind {
    /// A `FixedSizeList<float>` of `dim` values per transition.
    Continuous {
        /// Number of action dimensions.
        dim: usize,
    },
    /// One `int64` per transition (never one-hot).
    Discrete,
}

/// One column as described in a manifest (`schemas/manifest.schema.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnDesc {
    /// Column name.
    pub name: String,
    /// Type in the grammar of [`format::type_name`].
    #[serde(rename = "type")]
    pub data_type: String,
    /// Whether nulls are allowed.
    pub nullable: bool,
    /// Tensor shape of a fixed-size-list column (row-major); absent means `[list_size]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<usize>>,
    /// A frame column's codec, frame shape, dtype and dictionary (its type is `large_binary`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<FrameSpec>,
}

/// A validated transition schema. Cheap to clone.
#[derive(Debug, Clone, PartialEq)]
pub struct TransitionSchema {
    schema: SchemaRef,
    payload: SchemaRef,
    episodes: SchemaRef,
    obs_shape: Vec<usize>,
    action: ActionKind,
    /// The observation's frame spec, when it is a frame column.
    frame: Option<FrameSpec>,
    /// User columns that are frame columns (a LeRobot dataset's cameras), in column order.
    user_frames: Vec<(String, FrameSpec)>,
    /// What a writer is given: the payload, with frame columns as raw `uint8` tensors.
    input: SchemaRef,
}

/// Builds a [`TransitionSchema`] from shapes and types.
#[derive(Debug, Clone)]
pub struct TransitionSchemaBuilder {
    obs_type: DataType,
    obs_shape: Vec<usize>,
    action: ActionKind,
    action_type: DataType,
    next_observation: bool,
    extra: Vec<Field>,
    frames: Option<FrameSpec>,
}

impl TransitionSchemaBuilder {
    /// Observations of `shape` (row-major) with elements of type `elem` (default `float32`).
    pub fn observation(mut self, elem: DataType, shape: &[usize]) -> Self {
        self.obs_type = elem;
        self.obs_shape = shape.to_vec();
        self
    }
    /// Continuous actions: `dim` values of type `float32`.
    pub fn continuous_action(mut self, dim: usize) -> Self {
        self.action = ActionKind::Continuous { dim };
        self.action_type = DataType::Float32;
        self
    }
    /// Discrete actions stored as one `int64`.
    pub fn discrete_action(mut self) -> Self {
        self.action = ActionKind::Discrete;
        self.action_type = DataType::Int64;
        self
    }
    /// Store `next_observation` explicitly (default: derived from the next row).
    pub fn next_observation(mut self, store: bool) -> Self {
        self.next_observation = store;
        self
    }
    /// Stores observations as a frame column: one `uint8` image of `shape` (`[H, W]` or
    /// `[H, W, C]`) per row, compressed with `codec` (see [`crate::frames`]). Replaces the
    /// observation type and shape; `next_observation` is never stored (the next frame is the
    /// next row, and the episode table keeps each episode's final frame).
    pub fn frames(mut self, codec: FrameCodec, shape: &[usize]) -> Self {
        self.obs_type = DataType::UInt8;
        self.obs_shape = shape.to_vec();
        self.frames = Some(FrameSpec {
            codec,
            shape: shape.to_vec(),
            dtype: crate::frames::FRAME_DTYPE.into(),
            level: crate::frames::DEFAULT_LEVEL,
            dictionary: None,
        });
        self
    }
    /// Sets the zstd level of a frame column (1..=22, default [`crate::frames::DEFAULT_LEVEL`]).
    pub fn frame_level(mut self, level: i32) -> Self {
        if let Some(f) = self.frames.as_mut() {
            f.level = level;
        }
        self
    }
    /// Adds a user column (any fixed-width type of the manifest grammar).
    pub fn column(mut self, field: Field) -> Self {
        self.extra.push(field);
        self
    }
    /// Validates and builds.
    pub fn build(self) -> Result<TransitionSchema> {
        let n = self
            .obs_shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        let Some(n) = n else {
            return Err(Error::argument(
                "obs_shape",
                format!("observation shape {:?} is too large", self.obs_shape),
            ));
        };
        if self.obs_shape.is_empty() || n == 0 {
            return Err(Error::argument(
                "obs_shape",
                format!(
                    "observation shape {:?} must be non-empty with no zero dimension",
                    self.obs_shape
                ),
            ));
        }
        let obs = match &self.frames {
            Some(spec) => frame_field(col::OBSERVATION, spec, false)?,
            None => tensor_field(
                col::OBSERVATION,
                self.obs_type.clone(),
                &self.obs_shape,
                false,
            )?,
        };
        let action = match self.action {
            ActionKind::Continuous { dim } => {
                if dim == 0 {
                    return Err(Error::argument("act_dim", "action dimension must be > 0"));
                }
                Field::new(col::ACTION, fsl(self.action_type, dim)?, false)
            }
            ActionKind::Discrete => Field::new(col::ACTION, DataType::Int64, false),
        };
        let mut fields = vec![
            obs.clone(),
            action,
            Field::new(col::REWARD, DataType::Float32, false),
        ];
        if self.next_observation {
            fields.push(obs.with_name(col::NEXT_OBSERVATION));
        }
        fields.extend(self.extra);
        TransitionSchema::from_payload(&Schema::new(fields))
    }
}

/// A non-nullable `FixedSizeList<elem>[n]` type with a non-nullable `item` child.
pub fn fsl(elem: DataType, n: usize) -> Result<DataType> {
    let n =
        i32::try_from(n).map_err(|_| Error::argument("n", format!("list size {n} too large")))?;
    Ok(DataType::FixedSizeList(
        Field::new("item", elem, false).into(),
        n,
    ))
}

/// The number of elements of a tensor of `shape`, `None` when it overflows.
fn checked_size(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// A fixed-shape tensor field: flat `FixedSizeList` storage plus `arrow.fixed_shape_tensor` metadata.
pub fn tensor_field(name: &str, elem: DataType, shape: &[usize], nullable: bool) -> Result<Field> {
    let n = checked_size(shape)
        .ok_or_else(|| Error::schema(name, format!("shape {shape:?} has too many elements")))?;
    let shape_json = serde_json::json!({ "shape": shape }).to_string();
    Ok(
        Field::new(name, fsl(elem, n)?, nullable).with_metadata(HashMap::from([
            (
                meta::EXTENSION_NAME.to_string(),
                meta::FIXED_SHAPE_TENSOR.to_string(),
            ),
            (meta::EXTENSION_METADATA.to_string(), shape_json),
        ])),
    )
}

/// A frame column: `LargeBinary` (one encoded frame per row) with the `trajstore:frame` metadata.
pub fn frame_field(name: &str, spec: &FrameSpec, nullable: bool) -> Result<Field> {
    spec.check(name)?;
    Ok(Field::new(name, DataType::LargeBinary, nullable)
        .with_metadata(HashMap::from([(meta::FRAME.to_string(), spec.to_json())])))
}

/// The frame spec of `field`, when it is a frame column (`LargeBinary` with `trajstore:frame`
/// metadata); a `LargeBinary` field with bad metadata is [`Error::SchemaMismatch`].
pub fn field_frame(field: &Field) -> Result<Option<FrameSpec>> {
    match (field.data_type(), field.metadata().get(meta::FRAME)) {
        (DataType::LargeBinary, Some(json)) => FrameSpec::from_json(field.name(), json).map(Some),
        (DataType::LargeBinary, None) => Err(Error::schema(
            field.name(),
            format!("a large_binary column without `{}` metadata", meta::FRAME),
        )),
        _ => Ok(None),
    }
}

/// Reads the tensor shape of a fixed-size-list field from its extension metadata (or `[n]`).
pub fn field_shape(field: &Field) -> Result<Vec<usize>> {
    let DataType::FixedSizeList(_, n) = field.data_type() else {
        return Ok(vec![]);
    };
    let n = *n as usize;
    let md = field.metadata();
    if md.get(meta::EXTENSION_NAME).map(String::as_str) != Some(meta::FIXED_SHAPE_TENSOR) {
        return Ok(vec![n]);
    }
    let bad = |why: &str| {
        Error::schema(
            field.name(),
            format!("invalid {} metadata: {why}", meta::FIXED_SHAPE_TENSOR),
        )
    };
    let raw = md
        .get(meta::EXTENSION_METADATA)
        .ok_or_else(|| bad("missing"))?;
    let v: serde_json::Value = serde_json::from_str(raw).map_err(|e| bad(&e.to_string()))?;
    let shape: Vec<usize> = v
        .get("shape")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .ok_or_else(|| bad("no integer `shape` array"))?;
    if checked_size(&shape) != Some(n) {
        return Err(bad(&format!(
            "shape {shape:?} does not multiply to list size {n}"
        )));
    }
    Ok(shape)
}

fn boundary_fields() -> [Field; 6] {
    [
        Field::new(col::EPISODE_ID, DataType::UInt64, false),
        Field::new(col::STEP, DataType::UInt32, false),
        Field::new(col::IS_FIRST, DataType::Boolean, false),
        Field::new(col::IS_LAST, DataType::Boolean, false),
        Field::new(col::TERMINATED, DataType::Boolean, false),
        Field::new(col::TRUNCATED, DataType::Boolean, false),
    ]
}

fn is_numeric(dt: &DataType) -> bool {
    dt.is_integer() || dt.is_floating()
}

impl TransitionSchema {
    /// Starts a builder: `float32` observations of `obs_shape`, continuous `float32` actions of
    /// `act_dim`, no stored `next_observation`.
    pub fn builder(obs_shape: &[usize], act_dim: usize) -> TransitionSchemaBuilder {
        TransitionSchemaBuilder {
            obs_type: DataType::Float32,
            obs_shape: obs_shape.to_vec(),
            action: ActionKind::Continuous { dim: act_dim },
            action_type: DataType::Float32,
            next_observation: false,
            extra: vec![],
            frames: None,
        }
    }

    /// Validates the schema of the payload a user appends (everything but the boundary columns,
    /// in any order) and puts it in canonical order: observation, action, reward,
    /// next_observation, then user columns in their given order.
    pub fn from_payload(payload: &Schema) -> Result<Self> {
        let mut fields: Vec<Field> = boundary_fields().into();
        for name in [col::OBSERVATION, col::ACTION, col::REWARD] {
            let f = payload.field_with_name(name).map_err(|_| {
                Error::schema(
                    name,
                    format!("required column is missing (have: {})", names(payload)),
                )
            })?;
            fields.push(f.clone());
        }
        if let Ok(f) = payload.field_with_name(col::NEXT_OBSERVATION) {
            fields.push(f.clone());
        }
        for f in payload.fields() {
            if col::BOUNDARY.contains(&f.name().as_str()) {
                return Err(Error::schema(
                    f.name(),
                    "a boundary column, computed by the writer; do not pass it",
                ));
            }
            if ![
                col::OBSERVATION,
                col::ACTION,
                col::REWARD,
                col::NEXT_OBSERVATION,
            ]
            .contains(&f.name().as_str())
            {
                fields.push(f.as_ref().clone());
            }
        }
        Self::try_from_arrow(&Schema::new(fields))
    }

    /// Validates a full on-disk schema (boundary columns first, then the payload in canonical order).
    pub fn try_from_arrow(schema: &Schema) -> Result<Self> {
        let fields = schema.fields();
        let expected = boundary_fields();
        if fields.len() < expected.len() + 3 {
            return Err(Error::schema_mismatch(format!(
                "expected at least {} columns, found {} ({})",
                expected.len() + 3,
                fields.len(),
                names(schema)
            )));
        }
        for (f, e) in fields.iter().zip(expected.iter()) {
            if f.name() != e.name() || f.data_type() != e.data_type() || f.is_nullable() {
                return Err(Error::schema_types(
                    e.name(),
                    format!("`{}: {}` (non-null)", e.name(), e.data_type()),
                    format!(
                        "`{}: {}`{}",
                        f.name(),
                        f.data_type(),
                        if f.is_nullable() { " (nullable)" } else { "" }
                    ),
                    "the boundary columns come first, in order, each non-null and of its type",
                ));
            }
        }
        let rest = &fields[expected.len()..];
        let obs = &rest[0];
        if obs.name() != col::OBSERVATION {
            return Err(Error::schema(
                col::OBSERVATION,
                format!(
                    "expected after the boundary columns, found `{}` there",
                    obs.name()
                ),
            ));
        }
        let frame = field_frame(obs)?;
        match obs.data_type() {
            DataType::FixedSizeList(child, _) if is_numeric(child.data_type()) => {}
            DataType::LargeBinary if frame.is_some() => {}
            other => {
                return Err(Error::schema_types(
                    col::OBSERVATION,
                    "a fixed-size list of numbers, or a frame column",
                    other,
                    "unsupported observation type",
                ));
            }
        }
        let obs_shape = match &frame {
            Some(f) => f.shape.clone(),
            None => field_shape(obs)?,
        };
        let action = &rest[1];
        let action_kind = match action.data_type() {
            DataType::FixedSizeList(child, n) if child.data_type().is_floating() => {
                ActionKind::Continuous { dim: *n as usize }
            }
            DataType::Int64 => ActionKind::Discrete,
            other => {
                return Err(Error::schema_types(
                    col::ACTION,
                    "a fixed-size list of floats (continuous) or int64 (discrete)",
                    other,
                    "unsupported action type",
                ));
            }
        };
        if action.name() != col::ACTION {
            return Err(Error::schema(
                col::ACTION,
                format!(
                    "expected after `{}`, found `{}` there",
                    col::OBSERVATION,
                    action.name()
                ),
            ));
        }
        let reward = &rest[2];
        if reward.name() != col::REWARD || reward.data_type() != &DataType::Float32 {
            return Err(Error::schema_types(
                col::REWARD,
                format!("`{}: float32`", col::REWARD),
                format!("`{}: {}`", reward.name(), reward.data_type()),
                format!("expected after `{}`", col::ACTION),
            ));
        }
        for f in &rest[..3] {
            if f.is_nullable() {
                return Err(Error::schema(
                    f.name(),
                    "a required column must not be nullable",
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        let mut user_frames = vec![];
        for f in fields {
            if !seen.insert(f.name().as_str()) {
                return Err(Error::schema(f.name(), "duplicate column"));
            }
            if f.name() == col::OBSERVATION && frame.is_some() {
                continue;
            }
            if let Some(spec) = field_frame(f)? {
                // Boundary, action and reward columns were checked above; a frame
                // `next_observation` is refused below.
                if f.name() == col::NEXT_OBSERVATION {
                    continue;
                }
                if f.is_nullable() {
                    return Err(Error::schema(
                        f.name(),
                        "a frame column must not be nullable",
                    ));
                }
                user_frames.push((f.name().clone(), spec));
                continue;
            }
            if format::type_name(f.data_type()).is_none() {
                return Err(Error::schema_types(
                    f.name(),
                    "a fixed-width type (bool, ints, floats, or fixed-size lists of those)",
                    f.data_type(),
                    "only fixed-width types are stored",
                ));
            }
            if let DataType::FixedSizeList(child, _) = f.data_type()
                && child.is_nullable()
            {
                return Err(Error::schema(
                    f.name(),
                    "fixed-size list items must be non-nullable",
                ));
            }
        }
        for f in &rest[3..] {
            if f.name() == col::NEXT_OBSERVATION
                && (f.data_type() != obs.data_type() || f.is_nullable())
            {
                return Err(Error::schema_types(
                    col::NEXT_OBSERVATION,
                    format!("{} (non-null)", obs.data_type()),
                    format!(
                        "{}{}",
                        f.data_type(),
                        if f.is_nullable() { " (nullable)" } else { "" }
                    ),
                    format!(
                        "must have the type of `{}` and be non-null",
                        col::OBSERVATION
                    ),
                ));
            }
        }
        if let Some(pos) = rest.iter().position(|f| f.name() == col::NEXT_OBSERVATION)
            && pos != 3
        {
            return Err(Error::schema(
                col::NEXT_OBSERVATION,
                format!("must follow `{}`", col::REWARD),
            ));
        }
        let schema = Arc::new(schema.clone());
        let payload = Arc::new(Schema::new(rest.to_vec()));
        let has_next = rest.iter().any(|f| f.name() == col::NEXT_OBSERVATION);
        if has_next && frame.is_some() {
            return Err(Error::schema(
                col::NEXT_OBSERVATION,
                "a frame column is never stored twice: the next frame is the next row, and the \
                 episode table holds each episode's final frame",
            ));
        }
        let input = if frame.is_none() && user_frames.is_empty() {
            payload.clone()
        } else {
            let mut fields: Vec<Field> = payload
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            if let Some(spec) = &frame {
                fields[0] = tensor_field(col::OBSERVATION, DataType::UInt8, &spec.shape, false)?;
            }
            for (name, spec) in &user_frames {
                let i = payload.index_of(name).expect("a payload column");
                fields[i] = tensor_field(name, DataType::UInt8, &spec.shape, false)?;
            }
            Arc::new(Schema::new(fields))
        };
        let mut ep_fields = vec![
            Field::new(ep::EPISODE_ID, DataType::UInt64, false),
            Field::new(ep::ROW_START, DataType::UInt64, false),
            Field::new(ep::LENGTH, DataType::UInt64, false),
            Field::new(ep::EPISODE_RETURN, DataType::Float64, false),
            Field::new(ep::TERMINATED, DataType::Boolean, false),
            Field::new(ep::TRUNCATED, DataType::Boolean, false),
        ];
        if !has_next {
            ep_fields.push(
                obs.as_ref()
                    .clone()
                    .with_name(ep::FINAL_OBSERVATION)
                    .with_nullable(true),
            );
        }
        Ok(TransitionSchema {
            schema,
            payload,
            episodes: Arc::new(Schema::new(ep_fields)),
            obs_shape,
            action: action_kind,
            frame,
            user_frames,
            input,
        })
    }

    /// The observation's frame spec, when observations are a frame column.
    pub fn frame_spec(&self) -> Option<&FrameSpec> {
        self.frame.as_ref()
    }

    /// Every frame column with its spec: the observation first (when it is one), then the user
    /// columns that are frame columns (a LeRobot dataset's cameras), in column order.
    pub fn frame_columns(&self) -> Vec<(&str, &FrameSpec)> {
        let obs = self.frame.as_ref().map(|f| (col::OBSERVATION, f));
        obs.into_iter()
            .chain(self.user_frames.iter().map(|(n, f)| (n.as_str(), f)))
            .collect()
    }

    /// The schema of the episodes a writer is given: [`TransitionSchema::payload_schema`], except
    /// that a frame column is a raw `uint8` tensor of the frame's shape (the writer encodes it).
    pub fn input_schema(&self) -> &SchemaRef {
        &self.input
    }

    /// This schema with the frame column's dictionary set to `dictionary` (or its codec changed
    /// to plain `zstd` when `dictionary` is `None`: no dictionary could be trained).
    pub fn with_frame_dictionary(
        &self,
        dictionary: Option<crate::frames::DictionaryRef>,
    ) -> Result<Self> {
        self.with_column_dictionary(col::OBSERVATION, dictionary)
    }

    /// This schema with frame column `name`'s dictionary set to `dictionary` (or its codec
    /// changed to plain `zstd` when `dictionary` is `None`).
    pub fn with_column_dictionary(
        &self,
        name: &str,
        dictionary: Option<crate::frames::DictionaryRef>,
    ) -> Result<Self> {
        self.with_frame_spec(name, |spec| {
            if dictionary.is_none() {
                spec.codec = FrameCodec::Zstd;
            }
            spec.dictionary = dictionary;
        })
    }

    /// This schema with every frame column's zstd level set to `level` (1 to 22): what a dataset
    /// created by an ingest with `--frame-level` is written at. A level out of range is an
    /// [`Error::InvalidArgument`].
    pub fn with_frame_level(&self, level: i32) -> Result<Self> {
        crate::frames::check_level(level)?;
        let names: Vec<String> = self
            .frame_columns()
            .iter()
            .map(|(n, _)| n.to_string())
            .collect();
        names.iter().try_fold(self.clone(), |schema, name| {
            schema.with_frame_spec(name, |spec| spec.level = level)
        })
    }

    /// This schema with frame column `name`'s spec changed by `change`.
    fn with_frame_spec(&self, name: &str, change: impl FnOnce(&mut FrameSpec)) -> Result<Self> {
        let Some((_, spec)) = self.frame_columns().into_iter().find(|(n, _)| *n == name) else {
            return Err(Error::invalid_argument(format!(
                "the dataset has no frame column `{name}`"
            )));
        };
        let mut spec = spec.clone();
        change(&mut spec);
        let mut fields: Vec<Field> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        let i = self.schema.index_of(name).expect("a frame column");
        fields[i] = frame_field(name, &spec, false)?;
        Self::try_from_arrow(&Schema::new(fields))
    }

    /// The full on-disk schema of segment files.
    pub fn arrow_schema(&self) -> &SchemaRef {
        &self.schema
    }
    /// The schema of appended episode batches (no boundary columns).
    pub fn payload_schema(&self) -> &SchemaRef {
        &self.payload
    }
    /// The schema of episode tables.
    pub fn episode_schema(&self) -> &SchemaRef {
        &self.episodes
    }
    /// Shape of one observation.
    pub fn observation_shape(&self) -> &[usize] {
        &self.obs_shape
    }
    /// Number of scalar values in one observation.
    pub fn observation_len(&self) -> usize {
        self.obs_shape.iter().product()
    }
    /// The observation field.
    pub fn observation_field(&self) -> &Field {
        self.payload.field(0)
    }
    /// How actions are stored.
    pub fn action_kind(&self) -> &ActionKind {
        &self.action
    }
    /// Whether `next_observation` is stored (otherwise it is derived from the next row and the
    /// episode's `final_observation`).
    pub fn has_next_observation(&self) -> bool {
        self.payload
            .column_with_name(col::NEXT_OBSERVATION)
            .is_some()
    }
    /// Bytes of one row, excluding validity bitmaps (bools count 1/8).
    pub fn row_bytes(&self) -> f64 {
        self.schema
            .fields()
            .iter()
            .map(|f| value_bytes(f.data_type()))
            .sum()
    }

    /// The columns as written in manifests.
    pub fn to_columns(&self) -> Vec<ColumnDesc> {
        self.schema
            .fields()
            .iter()
            .map(|f| ColumnDesc {
                name: f.name().clone(),
                data_type: match field_frame(f).ok().flatten() {
                    Some(_) => format::FRAME_TYPE.into(),
                    None => format::type_name(f.data_type()).expect("validated fixed-width type"),
                },
                frame: field_frame(f).ok().flatten(),
                nullable: f.is_nullable(),
                shape: f
                    .metadata()
                    .get(meta::EXTENSION_NAME)
                    .filter(|n| n.as_str() == meta::FIXED_SHAPE_TENSOR)
                    .and_then(|_| field_shape(f).ok()),
            })
            .collect()
    }

    /// Rebuilds and validates a schema from manifest columns.
    pub fn from_columns(cols: &[ColumnDesc]) -> Result<Self> {
        let fields = cols
            .iter()
            .map(|c| {
                if let Some(spec) = &c.frame {
                    if c.data_type != format::FRAME_TYPE {
                        return Err(Error::schema(
                            &c.name,
                            format!("a frame column has type {}", format::FRAME_TYPE),
                        ));
                    }
                    return frame_field(&c.name, spec, c.nullable);
                }
                let dt = format::parse_type(&c.data_type)?;
                Ok(match (&dt, &c.shape) {
                    (DataType::FixedSizeList(child, _), Some(shape)) => {
                        let f =
                            tensor_field(&c.name, child.data_type().clone(), shape, c.nullable)?;
                        if f.data_type() != &dt {
                            return Err(Error::schema(
                                &c.name,
                                format!("shape {shape:?} does not match type {}", c.data_type),
                            ));
                        }
                        f
                    }
                    _ => Field::new(&c.name, dt, c.nullable),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Self::try_from_arrow(&Schema::new(fields))
    }

    /// Checks that `other` (e.g. a segment file's schema) has the same names, types and
    /// nullability. A difference is [`Error::SchemaMismatch`]: with the column, and the expected
    /// and found types, when a column of the same name differs in type or nullability.
    pub fn check_same(&self, other: &Schema) -> Result<()> {
        let a = self.schema.fields();
        let b = other.fields();
        if a.len() != b.len() {
            return Err(Error::schema_mismatch(format!(
                "{} columns, expected {} ({})",
                b.len(),
                a.len(),
                names(&self.schema)
            )));
        }
        let typed = |f: &Field| {
            let null = if f.is_nullable() { " (nullable)" } else { "" };
            format!("{}{null}", f.data_type())
        };
        for (x, y) in a.iter().zip(b.iter()) {
            if x.name() != y.name() {
                return Err(Error::schema(
                    x.name(),
                    format!(
                        "found column `{}: {}` where `{}: {}` was expected",
                        y.name(),
                        typed(y),
                        x.name(),
                        typed(x)
                    ),
                ));
            }
            if x.data_type() != y.data_type() || x.is_nullable() != y.is_nullable() {
                return Err(Error::schema_types(
                    x.name(),
                    typed(x),
                    typed(y),
                    "the column's type differs",
                ));
            }
        }
        Ok(())
    }
}

/// Bytes of one value of type `dt`, excluding validity bitmaps (bools count 1/8).
pub(crate) fn value_bytes(dt: &DataType) -> f64 {
    match dt {
        DataType::Boolean => 0.125,
        DataType::FixedSizeList(child, n) => *n as f64 * value_bytes(child.data_type()),
        other => other.primitive_width().unwrap_or(0) as f64,
    }
}

/// The column names of `schema`, comma-separated (for messages).
pub(crate) fn names(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_whose_size_overflows_is_an_error_not_a_panic() {
        let e = tensor_field("o", DataType::Float32, &[usize::MAX, 2], false).unwrap_err();
        assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
        let mut f = tensor_field("o", DataType::Float32, &[2, 3], false).unwrap();
        let mut md = f.metadata().clone();
        md.insert(
            meta::EXTENSION_METADATA.to_string(),
            format!("{{\"shape\": [{}, 4]}}", usize::MAX),
        );
        f = f.with_metadata(md);
        assert!(matches!(field_shape(&f), Err(Error::SchemaMismatch { .. })));
    }

    #[test]
    fn builder_produces_canonical_schema() {
        let s = TransitionSchema::builder(&[3, 4], 2)
            .next_observation(true)
            .column(Field::new("cost", DataType::Float64, true))
            .build()
            .unwrap();
        let names: Vec<_> = s
            .arrow_schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(
            names,
            [
                "episode_id",
                "step",
                "is_first",
                "is_last",
                "terminated",
                "truncated",
                "observation",
                "action",
                "reward",
                "next_observation",
                "cost"
            ]
        );
        assert_eq!(s.observation_shape(), &[3, 4]);
        assert_eq!(s.observation_len(), 12);
        assert!(s.has_next_observation());
        // Episode table has no final_observation when next_observation is stored.
        assert!(
            s.episode_schema()
                .column_with_name(ep::FINAL_OBSERVATION)
                .is_none()
        );
        // Manifest columns round-trip.
        let back = TransitionSchema::from_columns(&s.to_columns()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn rejects_bad_schemas() {
        assert!(TransitionSchema::builder(&[0], 2).build().is_err());
        assert!(TransitionSchema::builder(&[3], 0).build().is_err());
        let bad = Schema::new(vec![
            Field::new("observation", fsl(DataType::Float32, 3).unwrap(), false),
            Field::new("action", DataType::Utf8, false),
            Field::new("reward", DataType::Float32, false),
        ]);
        let err = TransitionSchema::from_payload(&bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("action"), "{err}");
        let missing = Schema::new(vec![Field::new(
            "observation",
            fsl(DataType::Float32, 3).unwrap(),
            false,
        )]);
        let err = TransitionSchema::from_payload(&missing)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("column `action`") && err.contains("is missing"),
            "{err}"
        );
        let string_col = TransitionSchema::builder(&[3], 1)
            .column(Field::new("note", DataType::Utf8, true))
            .build()
            .unwrap_err()
            .to_string();
        assert!(string_col.contains("fixed-width"), "{string_col}");
    }
}
