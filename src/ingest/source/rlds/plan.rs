//! How the step features of `features.json` become stored columns: the observation (one leaf
//! of `steps/observation`), the action (a leaf, or a dict concatenated), the reward, and every
//! other step leaf as a user column named by its path; the flags; what is not stored.

use arrow::datatypes::{DataType, Field};

use super::RldsOptions;
use super::features::{Dtype, Features, Kind, Leaf};
use crate::error::{Error, Result};
use crate::format::col;
use crate::frames::FrameSpec;
use crate::ingest::image::MAX_SIDE;
use crate::schema::{TransitionSchema, tensor_field};

/// A stored column and where its values come from.
#[derive(Debug, Clone)]
pub(super) struct Col {
    pub(super) name: String,
    /// Indices into the step leaves (several: an action dict, concatenated).
    pub(super) leaves: Vec<usize>,
    /// Element type stored.
    pub(super) elem: DataType,
    /// Per-step shape (empty: a scalar column).
    pub(super) shape: Vec<usize>,
    /// An image column of (H, W, C), and whether it is a frame column.
    pub(super) image: Option<([usize; 3], bool)>,
}

impl Col {
    pub(super) fn per_step(&self) -> usize {
        self.shape.iter().product::<usize>().max(1)
    }
}

/// How the step features become columns.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) features: Features,
    /// Observation first, then action, reward (absent: zeros), user columns.
    pub(super) cols: Vec<Col>,
    pub(super) reward: bool,
    /// Leaves of is_first, is_last, is_terminal.
    pub(super) flags: [Option<usize>; 3],
    /// Every leaf read from each record (columns' and flags'), with its per-step element count.
    pub(super) read: Vec<(usize, usize)>,
    pub(super) schema: TransitionSchema,
    pub(super) skipped: Vec<String>,
}

fn leaf_elem(dtype: Dtype, scalar: bool) -> DataType {
    match dtype {
        Dtype::Bool if scalar => DataType::Boolean,
        Dtype::Bool | Dtype::U8 => DataType::UInt8,
        Dtype::I8 => DataType::Int8,
        Dtype::I16 => DataType::Int16,
        Dtype::I32 => DataType::Int32,
        Dtype::I64 | Dtype::Str => DataType::Int64,
        Dtype::U16 => DataType::UInt16,
        Dtype::U32 => DataType::UInt32,
        Dtype::U64 => DataType::UInt64,
        Dtype::F16 | Dtype::F32 => DataType::Float32,
        Dtype::F64 => DataType::Float64,
    }
}

fn matches_name(path: &str, steps: &str, name: &str) -> bool {
    name == path || name.strip_prefix(steps).and_then(|n| n.strip_prefix('/')) == Some(path)
}

impl Plan {
    pub(super) fn key(&self, leaf: usize) -> String {
        format!("{}/{}", self.features.steps, self.features.step[leaf].path)
    }

    /// Builds the plan from `features.json`; image dimensions it leaves unknown come from
    /// `dims` (the first record's images).
    pub(super) fn build(
        features: Features,
        opts: &RldsOptions,
        dims: &dyn Fn(usize) -> Result<[usize; 3]>,
    ) -> Result<Plan> {
        let steps = features.steps.clone();
        let leaves = &features.step;
        let mut skipped: Vec<String> = features
            .episode
            .iter()
            .map(|l| format!("{}: episode-level features are not stored", l.path))
            .collect();
        let find = |p: &str| leaves.iter().position(|l| l.path == p);
        let flags = [find(col::IS_FIRST), find(col::IS_LAST), find("is_terminal")];
        let mut usable = vec![];
        for (i, l) in leaves.iter().enumerate() {
            let key = format!("{steps}/{}", l.path);
            if opts.drop.iter().any(|d| matches_name(&l.path, &steps, d)) {
                skipped.push(format!("{key}: dropped"));
            } else if let Kind::Skipped(why) = &l.kind {
                skipped.push(format!("{key}: {why}"));
            } else if matches!(l.kind, Kind::Tensor { .. }) && l.shape.contains(&None) {
                return Err(Error::schema(
                    key,
                    format!(
                        "a tensor of shape {:?} (a dimension of variable size) inside `{steps}` \
                         is not stored; leave it out with --drop-cols",
                        l.shape
                    ),
                ));
            } else {
                // Sizes a damaged features.json may claim: bounded before anything is allocated.
                let elements = l
                    .shape
                    .iter()
                    .try_fold(1usize, |n, d| n.checked_mul(d.unwrap_or(1)))
                    .filter(|&n| n <= 1 << 30);
                let side = l.kind != Kind::Image
                    || l.shape[..2].iter().all(|d| d.is_none_or(|d| d <= MAX_SIDE));
                if elements.is_none() || !side {
                    return Err(Error::schema(
                        key,
                        format!("shape {:?} in features.json is too large", l.shape),
                    ));
                }
                if !flags.contains(&Some(i)) {
                    usable.push(i);
                }
            }
        }
        if let Some(o) = &opts.observation
            && !usable
                .iter()
                .any(|&i| matches_name(&leaves[i].path, &steps, o))
        {
            return Err(Error::argument(
                "observation",
                format!("`{o}` is not a stored step feature"),
            ));
        }
        for (&f, name) in flags
            .iter()
            .zip([col::IS_FIRST, col::IS_LAST, "is_terminal"])
        {
            if let Some(f) = f {
                let l = &leaves[f];
                if !matches!(l.kind, Kind::Tensor { dtype, .. } if !dtype.is_float())
                    || !l.shape.is_empty()
                {
                    return Err(Error::schema(
                        format!("{steps}/{name}"),
                        "an RLDS flag must be a boolean (or integer) scalar",
                    ));
                }
            }
        }
        let in_obs = |l: &Leaf| l.path == col::OBSERVATION || l.path.starts_with("observation/");
        let obs_leaves: Vec<usize> = usable
            .iter()
            .copied()
            .filter(|&i| in_obs(&leaves[i]))
            .collect();
        let is_image = |i: &usize| leaves[*i].kind == Kind::Image;
        let last = |i: &usize| leaves[*i].path.rsplit('/').next() == Some("image");
        let obs = match &opts.observation {
            Some(o) => usable
                .iter()
                .copied()
                .find(|&i| matches_name(&leaves[i].path, &steps, o)),
            None => obs_leaves
                .iter()
                .copied()
                .find(|i| is_image(i) && last(i))
                .or_else(|| obs_leaves.iter().copied().find(is_image))
                .or_else(|| (obs_leaves.len() == 1).then(|| obs_leaves[0]))
                .or_else(|| find("observation/state").filter(|i| obs_leaves.contains(i)))
                .or_else(|| obs_leaves.first().copied()),
        };
        let Some(obs) = obs else {
            return Err(Error::schema(
                format!("{steps}/observation"),
                "no observation among the step features (pick one with --observation-col)",
            ));
        };
        let column = |i: usize, name: String, tensor: bool| -> Result<Col> {
            let l = &leaves[i];
            match l.kind {
                Kind::Image => {
                    let d = match l.shape.as_slice() {
                        [Some(h), Some(w), Some(c)] => [*h, *w, *c],
                        _ => dims(i)?,
                    };
                    Ok(Col {
                        name,
                        leaves: vec![i],
                        elem: DataType::UInt8,
                        shape: d.to_vec(),
                        image: Some((d, false)),
                    })
                }
                Kind::Tensor { dtype, .. } => {
                    let shape: Vec<usize> = l.shape.iter().map(|d| d.unwrap_or(0)).collect();
                    let shape = if tensor && shape.is_empty() {
                        vec![1]
                    } else {
                        shape
                    };
                    if shape.contains(&0) {
                        return Err(Error::schema(
                            format!("{steps}/{}", l.path),
                            format!("a tensor of shape {shape:?} holds no value"),
                        ));
                    }
                    Ok(Col {
                        name,
                        leaves: vec![i],
                        elem: leaf_elem(dtype, shape.is_empty()),
                        shape,
                        image: None,
                    })
                }
                Kind::Skipped(_) => unreachable!("skipped leaves are not usable"),
            }
        };
        let mut observation = column(obs, col::OBSERVATION.into(), true)?;
        let mut builder;
        match (&mut observation.image, opts.frame_codec) {
            (Some((d, frames)), Some(codec)) if FrameSpec::new(codec, d).is_ok() => {
                *frames = true;
                builder = TransitionSchema::builder(d, 1).frames(codec, d);
            }
            _ => {
                builder = TransitionSchema::builder(&observation.shape, 1)
                    .observation(observation.elem.clone(), &observation.shape);
            }
        }
        // The action: one leaf, or a dict of numeric leaves concatenated.
        let action_leaves: Vec<usize> = usable
            .iter()
            .copied()
            .filter(|&i| leaves[i].path == col::ACTION || leaves[i].path.starts_with("action/"))
            .collect();
        let action = match action_leaves.as_slice() {
            [] => {
                return Err(Error::schema(
                    format!("{steps}/action"),
                    "the steps have no action (trajstore stores transitions with actions)",
                ));
            }
            [one]
                if leaves[*one].path == col::ACTION
                    && leaves[*one].shape.is_empty()
                    && matches!(leaves[*one].kind, Kind::Tensor { dtype, .. } if !dtype.is_float()) =>
            {
                builder = builder.discrete_action();
                Col {
                    name: col::ACTION.into(),
                    leaves: vec![*one],
                    elem: DataType::Int64,
                    shape: vec![],
                    image: None,
                }
            }
            many => {
                let mut dim = 0;
                for &i in many {
                    let l = &leaves[i];
                    if !matches!(l.kind, Kind::Tensor { .. }) {
                        return Err(Error::schema(
                            format!("{steps}/{}", l.path),
                            "an action must be numeric",
                        ));
                    }
                    dim += l.shape.iter().map(|d| d.unwrap_or(0)).product::<usize>();
                }
                builder = builder.continuous_action(dim);
                Col {
                    name: col::ACTION.into(),
                    leaves: many.to_vec(),
                    elem: DataType::Float32,
                    shape: vec![dim],
                    image: None,
                }
            }
        };
        let reward_leaf = usable
            .iter()
            .copied()
            .find(|&i| leaves[i].path == col::REWARD);
        let mut cols = vec![observation, action];
        if let Some(r) = reward_leaf {
            let l = &leaves[r];
            let n: usize = l.shape.iter().map(|d| d.unwrap_or(0)).product();
            if !matches!(l.kind, Kind::Tensor { .. }) || n != 1 {
                return Err(Error::schema(
                    format!("{steps}/reward"),
                    format!("a reward must be one number per step (shape {:?})", l.shape),
                ));
            }
            cols.push(Col {
                name: col::REWARD.into(),
                leaves: vec![r],
                elem: DataType::Float32,
                shape: vec![],
                image: None,
            });
        }
        for &i in &usable {
            if i == obs || action_leaves.contains(&i) || Some(i) == reward_leaf {
                continue;
            }
            let mut c = column(i, leaves[i].path.clone(), false)?;
            // Every encoded image is a frame column (one compressed frame per step, with its
            // own dictionary), as the observation's is, unless images are kept as tensors.
            let frame = match (&mut c.image, opts.frame_codec) {
                (Some((d, frames)), Some(codec)) => {
                    let spec = FrameSpec::new(codec, d).ok();
                    *frames = spec.is_some();
                    spec
                }
                _ => None,
            };
            let field = if let Some(spec) = frame {
                crate::schema::frame_field(&c.name, &spec, false)?
            } else if c.shape.is_empty() {
                Field::new(&c.name, c.elem.clone(), false)
            } else {
                tensor_field(&c.name, c.elem.clone(), &c.shape, false)?
            };
            builder = builder.column(field);
            cols.push(c);
        }
        let schema = builder.build()?;
        let mut read: Vec<(usize, usize)> = vec![];
        for c in &cols {
            for &i in &c.leaves {
                let n = match &c.image {
                    Some(_) => 1,
                    None => leaves[i]
                        .shape
                        .iter()
                        .map(|d| d.unwrap_or(0))
                        .product::<usize>()
                        .max(1),
                };
                read.push((i, n));
            }
        }
        read.extend(flags.iter().flatten().map(|&f| (f, 1)));
        Ok(Plan {
            cols,
            reward: reward_leaf.is_some(),
            flags,
            read,
            schema,
            skipped,
            features,
        })
    }

    pub(super) fn report_columns(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .cols
            .iter()
            .map(|c| {
                let from: Vec<String> = c.leaves.iter().map(|&i| self.key(i)).collect();
                (c.name.clone(), from.join(" + "))
            })
            .collect();
        if !self.reward {
            out.insert(2, (col::REWARD.into(), "(none: 0.0)".into()));
        }
        out
    }

    pub(super) fn boundaries(&self) -> String {
        let names: Vec<String> = self.flags.iter().flatten().map(|&f| self.key(f)).collect();
        format!(
            "RLDS episodes (one record each; flags {}): the is_last step's observation is the \
             final observation, terminated where it has is_terminal",
            if names.is_empty() {
                "implied".to_string()
            } else {
                names.join(", ")
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_with_or_without_the_steps_prefix() {
        assert!(matches_name(
            "observation/state",
            "steps",
            "observation/state"
        ));
        assert!(matches_name(
            "observation/state",
            "steps",
            "steps/observation/state"
        ));
        assert!(!matches_name(
            "observation/state",
            "steps",
            "steps/observation"
        ));
        assert!(!matches_name(
            "observation/state",
            "steps",
            "stepsobservation/state"
        ));
    }
}
