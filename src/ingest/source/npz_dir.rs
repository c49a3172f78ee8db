//! `.npz` files read as one input: a directory of shards (OGBench's 100M and 1B datasets, one
//! file per episode in Procgen-style dumps), or one file whose layout is a [`Convention`] other
//! than plain rows.
//!
//! The files of a directory are read in natural name order (digit runs compare as numbers, so
//! `ep_2.npz` comes before `ep_10.npz`; zero-padded names sort the same either way), and are one
//! dataset: every file must have the same arrays, with the same dtypes and row shapes, as the
//! first. That is checked on every file's headers before anything is read (a mismatch names the
//! file, the array, and what the first file has), and again when a file is opened to be read.
//! A file is opened when its first unit is read and closed after its last, so memory and open
//! files are bounded by the files of one window of units, never the directory.
//!
//! Rows flow across files in order: under [`Convention::Rows`] an episode that the flags (or ids)
//! leave open at the end of a file continues in the next one; under [`Convention::Ogbench`]
//! every file must end on a trajectory end ([`Source::file_ends`]); under
//! [`Convention::EpisodeFiles`] each file is one episode.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use arrow::compute::concat;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::array::{Array, ArraySource, Data, open_npz, squeeze, unit_rows};
use super::npy::Loc;
use super::{Convention, ConventionReport, IngestOptions, Source};
use crate::error::{Error, Result};
use crate::format::col;

/// The synthesized column of [`Convention::EpisodeFiles`]: the file's index in name order.
pub(crate) const EPISODE_FILE: &str = "episode_file";

/// OGBench's keys, which recognise its convention.
const OGBENCH_KEYS: [&str; 3] = ["observations", "actions", "terminals"];

/// One file of the input.
struct NpzFile {
    path: PathBuf,
    /// The input row of its first row.
    first: u64,
    /// The rows it gives: its transitions, plus the final state's row of an episode file.
    rows: u64,
    /// The arrays with a row per state ([`Convention::EpisodeFiles`]).
    states: Vec<String>,
}

/// A file being read: its source and how many of its units are left.
#[derive(Default)]
struct Open {
    source: Option<Arc<ArraySource>>,
    left: usize,
}

/// `.npz` files as one [`Source`].
pub(crate) struct NpzFiles {
    path: PathBuf,
    schema: SchemaRef,
    convention: Convention,
    recognised: bool,
    left_out: Vec<PathBuf>,
    files: Vec<NpzFile>,
    drop: Vec<String>,
    compressed: bool,
    /// (file, unit of the file) of each unit, set by `units`.
    units: Mutex<Vec<(usize, usize)>>,
    open: Vec<Mutex<Open>>,
}

/// `a` before `b` in natural order: runs of digits compare as numbers.
pub(crate) fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    while let (Some(&p), Some(&q)) = (x.first(), y.first()) {
        if p.is_ascii_digit() && q.is_ascii_digit() {
            let run = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
            let (m, n) = (run(x), run(y));
            let strip = |s: &[u8]| {
                let z = s.iter().take_while(|&&c| c == b'0').count();
                s[z..].to_vec()
            };
            let (u, v) = (strip(&x[..m]), strip(&y[..n]));
            let o = u.len().cmp(&v.len()).then_with(|| u.cmp(&v));
            if o != Ordering::Equal {
                return o;
            }
            (x, y) = (&x[m..], &y[n..]);
        } else {
            if p != q {
                return p.cmp(&q);
            }
            (x, y) = (&x[1..], &y[1..]);
        }
    }
    x.len().cmp(&y.len()).then_with(|| a.cmp(b))
}

/// The `.npz` files directly in `dir`, in natural name order; errors if it also holds `.npy`
/// files (two layouts in one directory).
pub(crate) fn npz_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut npz = vec![];
    let mut npy = false;
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("npz") if path.is_file() => npz.push(path),
            Some("npy") => npy = true,
            _ => {}
        }
    }
    if npy && !npz.is_empty() {
        return Err(Error::argument(
            "input",
            format!(
                "{} holds both .npy files (one array each) and .npz archives (shards); put each \
                 dataset in a directory of its own",
                dir.display()
            ),
        ));
    }
    let name = |p: &PathBuf| p.file_name().map(|n| n.to_string_lossy().into_owned());
    npz.sort_by(|a, b| natural_cmp(&name(a).unwrap_or_default(), &name(b).unwrap_or_default()));
    Ok(npz)
}

fn is_val(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with("-val.npz"))
}

/// The kept arrays of one file, by name.
fn kept(arrays: &[(String, Option<Array>)]) -> impl Iterator<Item = &Array> {
    arrays.iter().filter_map(|(_, a)| a.as_ref())
}

/// The observation array of `opts` (or `observations`/`observation`) among `arrays`.
fn observation_name<'a>(
    arrays: &'a [(String, Option<Array>)],
    opts: &IngestOptions,
) -> Option<&'a str> {
    let wanted: Vec<&str> = if !opts.observation_cols.is_empty() {
        opts.observation_cols.iter().map(String::as_str).collect()
    } else if opts.observation_col != col::OBSERVATION {
        vec![opts.observation_col.as_str()]
    } else {
        vec![col::OBSERVATION, "observations"]
    };
    kept(arrays)
        .find(|a| wanted.contains(&a.name.as_str()))
        .map(|a| a.name.as_str())
}

/// The per-state arrays of an episode file (those with the observation's rows, one more than
/// every other array), or why the file is not one.
fn episode_states(
    arrays: &[(String, Option<Array>)],
    opts: &IngestOptions,
) -> std::result::Result<Vec<String>, String> {
    let obs = observation_name(arrays, opts)
        .ok_or_else(|| "it has no observation array (`observations`)".to_string())?;
    let states_rows = kept(arrays).find(|a| a.name == obs).map_or(0, Array::rows);
    let mut states = vec![];
    let mut steps = 0;
    for a in kept(arrays) {
        if a.rows() == states_rows {
            states.push(a.name.clone());
        } else if a.rows() + 1 == states_rows {
            steps += 1;
        } else {
            return Err(format!(
                "array `{}` has {} rows, `{obs}` {states_rows}: an episode file has T + 1 rows \
                 of states and T of everything else",
                a.name,
                a.rows()
            ));
        }
    }
    if steps == 0 {
        return Err(format!(
            "`{obs}` has as many rows ({states_rows}) as every other array; an episode file has \
             one observation more than actions"
        ));
    }
    Ok(states)
}

/// Whether the arrays are OGBench's, as `ogbench.load_dataset` reads them: its keys, one row
/// each, and none of the keys of the row-per-transition layouts (D4RL's `rewards`, `timeouts`,
/// `next_observations`).
fn looks_like_ogbench(arrays: &[(String, Option<Array>)]) -> bool {
    let has = |n: &str| kept(arrays).any(|a| a.name == n);
    let rows: Vec<usize> = kept(arrays).map(Array::rows).collect();
    OGBENCH_KEYS.iter().all(|k| has(k))
        && ![
            "rewards",
            "timeouts",
            "next_observations",
            "observation",
            "action",
        ]
        .iter()
        .any(|k| has(k))
        && rows.windows(2).all(|w| w[0] == w[1])
}

/// Element type and row shape of an array, as a column holds it.
fn row_type(a: &Array) -> (DataType, &[usize]) {
    (a.header.dtype.arrow.clone(), &a.header.shape[1..])
}

fn shape_text(shape: &[usize]) -> String {
    format!("{shape:?}")
}

impl NpzFiles {
    /// Opens `input` (a directory of `.npz` files, or one `.npz` file) when it is read as
    /// `.npz` files: a directory holding `.npz` files, or a file whose convention (asked for, or
    /// recognised) is not [`Convention::Rows`]. `None` otherwise (a directory of `.npy` files, a
    /// plain `.npz`). Reads the files' headers only.
    pub(crate) fn open(input: &Path, opts: &IngestOptions) -> Result<Option<NpzFiles>> {
        let drop = &opts.drop_cols;
        let (all, dir) = if input.is_dir() {
            let files = npz_files(input)?;
            if files.is_empty() {
                return Ok(None);
            }
            (files, true)
        } else {
            let mut magic = [0u8; 2];
            let n = std::fs::File::open(input)
                .and_then(|mut f| std::io::Read::read(&mut f, &mut magic))
                .map_err(|e| Error::io(input, e))?;
            if &magic[..n] != b"PK" {
                return Ok(None); // not an archive: the array source says what it is
            }
            (vec![input.to_path_buf()], false)
        };
        // The layout is decided on the first training file (OGBench's `-val` files aside).
        let reference = all.iter().find(|p| !is_val(p)).unwrap_or(&all[0]).clone();
        let mut first = open_npz(&reference, drop, false)?;
        squeeze(&mut first);
        let boundaries = opts.episode_col.is_some()
            || opts.terminated_col.is_some()
            || opts.truncated_col.is_some();
        let (convention, recognised) = match opts.convention {
            Some(c) => (c, false),
            None if !boundaries && looks_like_ogbench(&first) => (Convention::Ogbench, true),
            None if opts.episode_col.is_none() && episode_states(&first, opts).is_ok() => {
                (Convention::EpisodeFiles, true)
            }
            None => (Convention::Rows, false),
        };
        if !dir && convention == Convention::Rows {
            return Ok(None);
        }
        let fail = |why: String| {
            Err(Error::argument(
                "convention",
                format!(
                    "--convention {convention} does not fit {}: {why}",
                    reference.display()
                ),
            ))
        };
        match convention {
            Convention::Ogbench => {
                if let Some(k) = OGBENCH_KEYS
                    .iter()
                    .find(|k| !kept(&first).any(|a| a.name == **k))
                {
                    return fail(format!(
                        "it has no array `{k}` (OGBench files have observations, actions and terminals)"
                    ));
                }
                if boundaries {
                    return fail(
                        "OGBench's `terminals` marks each trajectory's last row; leave out \
                         --episode-col, --terminated-col and --truncated-col (or pass \
                         --convention rows to read every row as a transition)"
                            .into(),
                    );
                }
            }
            Convention::EpisodeFiles => {
                if opts.episode_col.is_some() {
                    return fail("each file is one episode; leave out --episode-col".into());
                }
                if let Err(why) = episode_states(&first, opts) {
                    return fail(why);
                }
            }
            Convention::Rows => {}
        }
        let (files, left_out): (Vec<PathBuf>, Vec<PathBuf>) =
            if convention == Convention::Ogbench && dir && all.iter().any(|p| !is_val(p)) {
                all.into_iter().partition(|p| !is_val(p))
            } else {
                (all, vec![])
            };
        // Every file against the reference: same arrays, dtypes and row shapes.
        let want: Vec<(String, DataType, Vec<usize>)> = kept(&first)
            .map(|a| {
                let (dt, shape) = row_type(a);
                (a.name.clone(), dt, shape.to_vec())
            })
            .collect();
        let mut out = vec![];
        let mut compressed = false;
        let mut row = 0u64;
        for path in &files {
            let mut arrays = match path == &reference {
                true => first.clone(),
                false => {
                    let mut a = open_npz(path, drop, false)?;
                    squeeze(&mut a);
                    a
                }
            };
            check_like(path, &reference, &arrays, &want)?;
            let states = match convention {
                Convention::EpisodeFiles => {
                    episode_states(&arrays, opts).map_err(|why| Loc::file(path).schema(why))?
                }
                _ => vec![],
            };
            compressed |= kept(&arrays).any(|a| matches!(a.data, Data::Deflated { .. }));
            // Within the file: one row per transition (the checks of an array source).
            let probe =
                ArraySource::with_states(path, std::mem::take(&mut arrays), None, 0, &states)?;
            let steps = probe.rows();
            let rows = match convention {
                // A file of one state holds no transition: it gives no rows.
                Convention::EpisodeFiles if steps == 0 => 0,
                Convention::EpisodeFiles => steps + 1,
                _ => steps,
            };
            out.push(NpzFile {
                path: path.clone(),
                first: row,
                rows,
                states,
            });
            row += rows;
        }
        let probe = ArraySource::with_states(
            &reference,
            first,
            None,
            0,
            &out.iter()
                .find(|f| f.path == reference)
                .map(|f| f.states.clone())
                .unwrap_or_default(),
        )?;
        let mut fields: Vec<Field> = probe
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        if convention == Convention::EpisodeFiles {
            if fields.iter().any(|f| f.name() == EPISODE_FILE) {
                return Err(Loc::array(&reference, EPISODE_FILE).schema(format!(
                    "an array is named `{EPISODE_FILE}`, the column of the file's index that the \
                     episode-files convention adds; rename it or pass --drop-cols {EPISODE_FILE}"
                )));
            }
            fields.push(Field::new(EPISODE_FILE, DataType::UInt64, false));
        }
        let n = out.len();
        Ok(Some(NpzFiles {
            path: input.to_path_buf(),
            schema: Arc::new(Schema::new(fields)),
            convention,
            recognised,
            left_out,
            files: out,
            drop: drop.clone(),
            compressed,
            units: Mutex::new(vec![]),
            open: (0..n).map(|_| Mutex::new(Open::default())).collect(),
        }))
    }

    /// The source of file `f`, opened (and checked against the schema) if it is not open.
    fn file(&self, f: usize) -> Result<Arc<ArraySource>> {
        let mut open = self.open[f].lock().expect("file lock");
        if let Some(s) = &open.source {
            return Ok(s.clone());
        }
        let file = &self.files[f];
        let mut arrays = open_npz(&file.path, &self.drop, true)?;
        squeeze(&mut arrays);
        let source = ArraySource::with_states(&file.path, arrays, None, 0, &file.states)?;
        for field in self.schema.fields() {
            if field.name() == EPISODE_FILE && self.convention == Convention::EpisodeFiles {
                continue;
            }
            let have = source.schema();
            let found = have.field_with_name(field.name()).ok();
            if found.is_none_or(|h| h.data_type() != field.data_type()) {
                return Err(Error::schema_types(
                    field.name(),
                    crate::format::type_name(field.data_type())
                        .unwrap_or_else(|| field.data_type().to_string()),
                    found.map_or("no such array".into(), |h| h.data_type().to_string()),
                    format!(
                        "{}: the file changed while it was being ingested",
                        file.path.display()
                    ),
                ));
            }
        }
        let source = Arc::new(source);
        open.source = Some(source.clone());
        Ok(source)
    }

    /// One unit of file `f` is done: closes the file after its last.
    fn done(&self, f: usize) {
        let mut open = self.open[f].lock().expect("file lock");
        open.left = open.left.saturating_sub(1);
        if open.left == 0 {
            open.source = None;
        }
    }

    /// The rows of episode file `f` (all in one unit): `T + 1`, the per-step arrays' last row
    /// repeated on the final state's row (so that flags read on an episode's last row are its
    /// last step's), and the file's index.
    fn read_episode(
        &self,
        f: usize,
        source: &ArraySource,
        projection: &[usize],
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        let file = &self.files[f];
        let n = file.rows as usize;
        let mut columns: Vec<ArrayRef> = vec![];
        for &i in projection {
            let name = self.schema.field(i).name();
            if name == EPISODE_FILE {
                columns.push(Arc::new(UInt64Array::from(vec![f as u64; n])));
                continue;
            }
            let local = source.schema().index_of(name)?;
            columns.push(if file.states.contains(name) {
                source.read_column(local, 0, n)?
            } else {
                let steps = source.read_column(local, 0, n - 1)?;
                concat(&[steps.as_ref(), steps.slice(n - 2, 1).as_ref()])?
            });
        }
        let batch = RecordBatch::try_new(Arc::new(self.schema.project(projection)?), columns)?;
        let step = batch_rows.max(1);
        Ok((0..n)
            .step_by(step)
            .map(|at| batch.slice(at, step.min(n - at)))
            .collect())
    }
}

/// Checks that the arrays of `path` are those of the reference file (`want`: name, element type,
/// row shape), naming the file, the array, and what differs.
fn check_like(
    path: &Path,
    reference: &Path,
    arrays: &[(String, Option<Array>)],
    want: &[(String, DataType, Vec<usize>)],
) -> Result<()> {
    let why = |what: &str| {
        format!(
            "{}: {what} than the first file, {}; every file of the directory must have the same \
             arrays, dtypes and row shapes",
            path.display(),
            reference.display()
        )
    };
    for (name, dt, shape) in want {
        let Some(a) = kept(arrays).find(|a| &a.name == name) else {
            return Err(Error::schema_types(
                name,
                format!("an array `{name}`"),
                "no such array",
                why("it has other arrays"),
            ));
        };
        let (got_dt, got_shape) = row_type(a);
        // An empty array saved without its row shape (`np.array([])`) has none to compare.
        let empty = a.rows() == 0 && got_shape.is_empty();
        if &got_dt != dt {
            let label = |d: &DataType| crate::format::type_name(d).unwrap_or_else(|| d.to_string());
            return Err(Error::schema_types(
                name,
                label(dt),
                label(&got_dt),
                why("it has another dtype"),
            ));
        }
        if !empty && got_shape != shape.as_slice() {
            return Err(Error::schema_types(
                name,
                format!("rows of shape {}", shape_text(shape)),
                format!("rows of shape {}", shape_text(got_shape)),
                why("it has another row shape"),
            ));
        }
    }
    if let Some(a) = kept(arrays).find(|a| !want.iter().any(|w| w.0 == a.name)) {
        return Err(Error::schema_types(
            &a.name,
            "no such array",
            format!("an array `{}`", a.name),
            why(&format!(
                "it has an array more (pass --drop-cols {} to leave it out)",
                a.name
            )),
        ));
    }
    Ok(())
}

impl Source for NpzFiles {
    super::path_and_schema_fields!();

    fn units(&self, batch_rows: usize) -> Vec<(usize, u64, u64)> {
        let per = unit_rows(batch_rows);
        let mut units = vec![];
        let mut out = vec![];
        for (f, file) in self.files.iter().enumerate() {
            let per = match self.convention {
                Convention::EpisodeFiles => file.rows.max(1),
                _ => per,
            };
            let k = file.rows.div_ceil(per) as usize;
            for u in 0..k {
                let at = u as u64 * per;
                out.push((units.len(), file.first + at, per.min(file.rows - at)));
                units.push((f, u));
            }
            self.open[f].lock().expect("file lock").left = k;
        }
        *self.units.lock().expect("units lock") = units;
        out
    }

    fn parallel(&self) -> bool {
        !self.compressed
    }

    fn read(
        &self,
        unit: usize,
        projection: &[usize],
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        let (f, u) = *self
            .units
            .lock()
            .expect("units lock")
            .get(unit)
            .ok_or_else(|| Error::argument("unit", format!("no unit {unit}")))?;
        let source = self.file(f)?;
        let out = if self.convention == Convention::EpisodeFiles {
            self.read_episode(f, &source, projection, batch_rows)
        } else {
            let names = source.schema();
            let local = projection
                .iter()
                .map(|&i| names.index_of(self.schema.field(i).name()))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let schema = Arc::new(self.schema.project(projection)?);
            source.read(u, &local, batch_rows).and_then(|batches| {
                batches
                    .into_iter()
                    .map(|b| Ok(RecordBatch::try_new(schema.clone(), b.columns().to_vec())?))
                    .collect()
            })
        };
        self.done(f);
        out
    }

    fn episode_column(&self) -> Option<&str> {
        (self.convention == Convention::EpisodeFiles).then_some(EPISODE_FILE)
    }

    fn convention(&self) -> Option<ConventionReport> {
        Some(ConventionReport {
            convention: self.convention,
            recognised: self.recognised,
            files: self.files.len() as u64,
            left_out: self.left_out.clone(),
        })
    }

    fn file_of(&self, row: u64) -> Option<&Path> {
        let i = self.files.partition_point(|f| f.first + f.rows <= row);
        self.files.get(i).map(|f| f.path.as_path())
    }

    fn file_ends(&self) -> Vec<(u64, PathBuf)> {
        if self.convention != Convention::Ogbench {
            return vec![];
        }
        self.files
            .iter()
            .filter(|f| f.rows > 0)
            .map(|f| (f.first + f.rows, f.path.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_compares_digit_runs_as_numbers() {
        let mut names = vec![
            "ep_10.npz",
            "ep_2.npz",
            "ep_1.npz",
            "a-000.npz",
            "a-001.npz",
            "ep_02.npz",
        ];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            [
                "a-000.npz",
                "a-001.npz",
                "ep_1.npz",
                "ep_02.npz",
                "ep_2.npz",
                "ep_10.npz"
            ]
        );
        assert_eq!(natural_cmp("x9", "x10"), Ordering::Less);
        assert_eq!(natural_cmp("b", "a1"), Ordering::Greater);
    }
}
