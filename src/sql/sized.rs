//! Built-in SQL functions whose output size an argument decides (`repeat('x', 2147483647)`,
//! `array_repeat(v, n)`, `range(n)`, `generate_series(a, b)`): DataFusion allocates their results
//! outside its memory pool, so a query of one line could take all of the machine's memory
//! (constant folding runs them while planning, before any operator reserves anything). Each
//! is registered under its own name as a wrapper that estimates the output's bytes from its
//! arguments and refuses a call whose output alone exceeds the SQL memory limit, before the
//! inner function allocates.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::{Result as DfResult, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature,
};

/// How the output size of a wrapped function follows from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Size {
    /// `repeat(string, n)`: `len(string) * n` bytes.
    Repeat,
    /// `array_repeat(element, n)`: `n` elements of the element's size.
    ArrayRepeat,
    /// `range([start,] stop [, step])`, `generate_series(...)`: `(stop - start) / step` int64s.
    Range,
}

/// A built-in function that checks its output size first (see the module docs).
#[derive(Debug, PartialEq, Eq, Hash)]
struct SizeChecked {
    inner: Arc<ScalarUDF>,
    size: Size,
}

/// The wrapped built-ins, to register in a session after DataFusion's (same names replace them).
pub(crate) fn sized_udfs() -> Vec<ScalarUDF> {
    use datafusion::functions_nested::{range, repeat};
    [
        (datafusion::functions::string::repeat(), Size::Repeat),
        (repeat::array_repeat_udf(), Size::ArrayRepeat),
        (range::range_udf(), Size::Range),
        (range::gen_series_udf(), Size::Range),
    ]
    .into_iter()
    .map(|(inner, size)| ScalarUDF::new_from_impl(SizeChecked { inner, size }))
    .collect()
}

/// Per-row int64 values of an argument (None where it is null or not an integer).
enum Ints {
    One(Option<i64>),
    Many(ArrayRef),
}

impl Ints {
    fn of(v: &ColumnarValue) -> Option<Self> {
        Some(match v {
            ColumnarValue::Scalar(s) => Ints::One(match s.cast_to(&DataType::Int64).ok()? {
                ScalarValue::Int64(n) => n,
                _ => return None,
            }),
            ColumnarValue::Array(a) => Ints::Many(cast(a, &DataType::Int64).ok()?),
        })
    }

    fn get(&self, i: usize) -> Option<i64> {
        match self {
            Ints::One(n) => *n,
            Ints::Many(a) => {
                let a = a.as_primitive::<Int64Type>();
                a.is_valid(i).then(|| a.value(i))
            }
        }
    }

    fn is_scalar(&self) -> bool {
        matches!(self, Ints::One(_))
    }
}

/// Bytes of each row of a string or element argument.
fn byte_lengths(v: &ColumnarValue) -> Option<Ints> {
    Some(match v {
        ColumnarValue::Scalar(s) => Ints::One(Some(match s {
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)) => s.len() as i64,
            other => other.size() as i64,
        })),
        ColumnarValue::Array(a) => match arrow::compute::kernels::length::length(a) {
            Ok(l) => Ints::Many(cast(&l, &DataType::Int64).ok()?),
            // Not a string: the average element size.
            Err(_) => Ints::One(Some(
                (a.get_array_memory_size() / a.len().max(1)).max(1) as i64
            )),
        },
    })
}

impl SizeChecked {
    /// The output's bytes, when the arguments say (saturating).
    fn estimate(&self, args: &[ColumnarValue], rows: usize) -> Option<u128> {
        let all_scalar = args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let rows = if all_scalar { 1 } else { rows };
        let per_row =
            |f: &dyn Fn(usize) -> u128| (0..rows).map(f).fold(0u128, u128::saturating_add);
        match self.size {
            Size::Repeat | Size::ArrayRepeat => {
                let len = byte_lengths(args.first()?)?;
                let n = Ints::of(args.get(1)?)?;
                if len.is_scalar() && n.is_scalar() {
                    return Some(positive(len.get(0)) * positive(n.get(0)) * rows as u128);
                }
                Some(per_row(&|i| positive(len.get(i)) * positive(n.get(i))))
            }
            Size::Range => {
                let ints: Vec<Ints> = args.iter().map(Ints::of).collect::<Option<_>>()?;
                let (start, stop, step) = match ints.as_slice() {
                    [stop] => (None, stop, None),
                    [start, stop] => (Some(start), stop, None),
                    [start, stop, step] => (Some(start), stop, Some(step)),
                    _ => return None,
                };
                Some(per_row(&|i| {
                    let a = start.and_then(|s| s.get(i)).unwrap_or(0) as i128;
                    let b = stop.get(i).unwrap_or(0) as i128;
                    let s = step
                        .and_then(|s| s.get(i))
                        .unwrap_or(1)
                        .unsigned_abs()
                        .max(1);
                    ((b - a).unsigned_abs() / s as u128 + 1) * 8
                }))
            }
        }
    }
}

fn positive(n: Option<i64>) -> u128 {
    n.unwrap_or(0).max(0) as u128
}

impl ScalarUDFImpl for SizeChecked {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }
    fn signature(&self) -> &Signature {
        self.inner.signature()
    }
    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.inner.return_type(arg_types)
    }
    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        self.inner.return_field_from_args(args)
    }
    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }
    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let (limit, from) =
            super::limits::memory_limit().map_err(|e| DataFusionError::External(Box::new(e)))?;
        if let Some(bytes) = self.estimate(&args.args, args.number_rows)
            && bytes > limit as u128
        {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{}(...) would return about {:.1} GiB, more than the SQL memory limit of {:.1} \
                 GiB ({from})",
                self.name(),
                bytes as f64 / (1u64 << 30) as f64,
                limit as f64 / (1u64 << 30) as f64
            )));
        }
        self.inner.invoke_with_args(args)
    }
}
