//! trajstore's SQL functions: `fsl_get`, `vec_norm`, the per-dimension aggregates,
//! `discounted_return`, and `octet_length` extended to binary values (the frames of a frame
//! column), as PostgreSQL and DuckDB have it.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Float64Array, UInt64Array};
use arrow::compute::{cast, take};
use arrow::datatypes::{DataType, Field, FieldRef, Float64Type, UInt64Type};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDFImpl, ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature,
    Volatility,
};

/// `octet_length(x)`: DataFusion's for strings, and the byte length of a binary value
/// (`Binary`, `LargeBinary`, `BinaryView`: a frame column's encoded frames), read from the
/// offsets alone (nothing decoded or copied); `Int64` for `LargeBinary`, `Int32` otherwise, as
/// for strings. DataFusion 55's accepts strings only (upstream accepts binary from
/// apache/datafusion#24867 on); registered under its name, this replaces it.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct OctetLength {
    inner: Arc<datafusion::logical_expr::ScalarUDF>,
    signature: Signature,
}

impl OctetLength {
    pub(crate) fn new() -> Self {
        use datafusion::logical_expr::TypeSignature;
        let inner = datafusion::functions::string::octet_length();
        let binary = [
            DataType::Binary,
            DataType::LargeBinary,
            DataType::BinaryView,
        ]
        .map(|t| TypeSignature::Exact(vec![t]));
        let mut one_of = vec![inner.signature().type_signature.clone()];
        one_of.extend(binary);
        Self {
            inner,
            signature: Signature::one_of(one_of, Volatility::Immutable),
        }
    }

    /// The result type for a binary argument; `None` for anything else (DataFusion's).
    fn binary_len_type(t: &DataType) -> Option<DataType> {
        match t {
            DataType::LargeBinary => Some(DataType::Int64),
            DataType::Binary | DataType::BinaryView => Some(DataType::Int32),
            _ => None,
        }
    }
}

impl ScalarUDFImpl for OctetLength {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        match arg_types.first().and_then(Self::binary_len_type) {
            Some(t) => Ok(t),
            None => self.inner.return_type(arg_types),
        }
    }
    fn return_field_from_args(
        &self,
        args: datafusion::logical_expr::ReturnFieldArgs,
    ) -> DfResult<FieldRef> {
        match args.arg_fields.first() {
            Some(f) => match Self::binary_len_type(f.data_type()) {
                Some(t) => Ok(Arc::new(Field::new(self.name(), t, f.is_nullable()))),
                None => self.inner.return_field_from_args(args),
            },
            None => self.inner.return_field_from_args(args),
        }
    }
    fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
        self.inner.documentation()
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let len = match args.args.first() {
            Some(ColumnarValue::Array(a)) if Self::binary_len_type(a.data_type()).is_some() => {
                ColumnarValue::Array(arrow::compute::kernels::length::length(a)?)
            }
            Some(ColumnarValue::Scalar(ScalarValue::LargeBinary(b))) => {
                ColumnarValue::Scalar(ScalarValue::Int64(b.as_ref().map(|b| b.len() as i64)))
            }
            Some(ColumnarValue::Scalar(ScalarValue::Binary(b) | ScalarValue::BinaryView(b))) => {
                ColumnarValue::Scalar(ScalarValue::Int32(b.as_ref().map(|b| b.len() as i32)))
            }
            _ => return self.inner.invoke_with_args(args),
        };
        Ok(len)
    }
}

pub(crate) fn fsl_arg<'a>(name: &str, a: &'a ArrayRef) -> DfResult<&'a FixedSizeListArray> {
    a.as_fixed_size_list_opt().ok_or_else(|| {
        DataFusionError::Plan(format!(
            "{name} takes a fixed-size-list column, got {}",
            a.data_type()
        ))
    })
}

pub(crate) fn fsl_type_check(name: &str, t: &DataType) -> DfResult<(FieldRef, i32)> {
    match t {
        DataType::FixedSizeList(f, n) if f.data_type().is_numeric() => Ok((f.clone(), *n)),
        other => Err(DataFusionError::Plan(format!(
            "{name} takes a fixed-size list of numbers (e.g. observation or action), got {other}"
        ))),
    }
}

/// `fsl_get(col, i)`: element `i` (1-based) of each fixed-size list; null when out of range.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct FslGet {
    signature: Signature,
}

impl FslGet {
    pub(crate) fn new() -> Self {
        Self {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for FslGet {
    fn name(&self) -> &str {
        "fsl_get"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        match &arg_types[0] {
            DataType::FixedSizeList(f, _) if arg_types[1].is_integer() => Ok(f.data_type().clone()),
            _ => Err(DataFusionError::Plan(format!(
                "fsl_get(list, index) takes a fixed-size list and an integer, got ({}, {})",
                arg_types[0], arg_types[1]
            ))),
        }
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let n = args.number_rows;
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let list = fsl_arg("fsl_get", &arrays[0])?;
        let idx = cast(&arrays[1], &DataType::Int64)?;
        let idx = idx.as_primitive::<arrow::datatypes::Int64Type>();
        // A fixed-size list's `values()` start at its first row (slicing slices them).
        let w = list.value_length() as i64;
        let indices: UInt64Array = (0..n)
            .map(|r| {
                if list.is_null(r) || idx.is_null(r) {
                    return None;
                }
                let i = idx.value(r);
                (1..=w).contains(&i).then(|| (r as i64 * w + i - 1) as u64)
            })
            .collect();
        Ok(ColumnarValue::Array(take(
            list.values().as_ref(),
            &indices,
            None,
        )?))
    }
}

/// `vec_norm(col)`: the L2 norm of each fixed-size list, as float64.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct VecNorm {
    signature: Signature,
}

impl VecNorm {
    pub(crate) fn new() -> Self {
        Self {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for VecNorm {
    fn name(&self) -> &str {
        "vec_norm"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        fsl_type_check("vec_norm", &arg_types[0])?;
        Ok(DataType::Float64)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let list = fsl_arg("vec_norm", &arrays[0])?;
        let w = list.value_length() as usize;
        let values = f64_values(list)?;
        let out: Float64Array = (0..list.len())
            .map(|r| {
                (!list.is_null(r)).then(|| {
                    values[r * w..(r + 1) * w]
                        .iter()
                        .map(|x| x * x)
                        .sum::<f64>()
                        .sqrt()
                })
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// The values of `list`'s rows as f64, `len * width` of them.
pub(crate) fn f64_values(list: &FixedSizeListArray) -> DfResult<Vec<f64>> {
    let values = cast(list.values(), &DataType::Float64)?;
    Ok(values.as_primitive::<Float64Type>().values().to_vec())
}

// ---------------------------------------------------------------------------------------------
// Aggregates

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum DimKind {
    Mean,
    Min,
    Max,
    Std,
}

/// `dim_mean/min/max/std(col)`: per-dimension statistics of a fixed-size-list column.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct DimAgg {
    kind: DimKind,
    signature: Signature,
}

impl DimAgg {
    pub(crate) fn new(kind: DimKind) -> Self {
        Self {
            kind,
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

pub(crate) fn f64_fsl_type(n: i32) -> DataType {
    DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float64, true)), n)
}

impl AggregateUDFImpl for DimAgg {
    fn name(&self) -> &str {
        match self.kind {
            DimKind::Mean => "dim_mean",
            DimKind::Min => "dim_min",
            DimKind::Max => "dim_max",
            DimKind::Std => "dim_std",
        }
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        let (_, n) = fsl_type_check(self.name(), &arg_types[0])?;
        Ok(f64_fsl_type(n))
    }
    fn accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        let (_, n) = fsl_type_check(self.name(), args.expr_fields[0].data_type())?;
        Ok(Box::new(DimAccumulator::new(self.kind, n as usize)))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        let (_, n) = fsl_type_check(self.name(), args.input_fields[0].data_type())?;
        let f = |s: &str, t: DataType| Arc::new(Field::new(format!("{}_{s}", args.name), t, true));
        Ok(vec![
            f("count", DataType::UInt64),
            f("mean", f64_fsl_type(n)),
            f("m2", f64_fsl_type(n)),
            f("min", f64_fsl_type(n)),
            f("max", f64_fsl_type(n)),
        ])
    }
}

/// Count, mean, sum of squared deviations (merged with Chan et al.'s formula), min and max per
/// dimension.
#[derive(Debug)]
pub(crate) struct DimAccumulator {
    kind: DimKind,
    n: usize,
    count: u64,
    mean: Vec<f64>,
    m2: Vec<f64>,
    min: Vec<f64>,
    max: Vec<f64>,
}

impl DimAccumulator {
    fn new(kind: DimKind, n: usize) -> Self {
        Self {
            kind,
            n,
            count: 0,
            mean: vec![0.0; n],
            m2: vec![0.0; n],
            min: vec![f64::INFINITY; n],
            max: vec![f64::NEG_INFINITY; n],
        }
    }

    /// Merges a partial state (count, mean, m2, min, max) into this one.
    fn merge(&mut self, count: u64, mean: &[f64], m2: &[f64], min: &[f64], max: &[f64]) {
        if count == 0 {
            return;
        }
        let (na, nb) = (self.count as f64, count as f64);
        let total = na + nb;
        for d in 0..self.n {
            let delta = mean[d] - self.mean[d];
            self.mean[d] += delta * nb / total;
            self.m2[d] += m2[d] + delta * delta * na * nb / total;
            self.min[d] = self.min[d].min(min[d]);
            self.max[d] = self.max[d].max(max[d]);
        }
        self.count += count;
    }

    fn fsl(&self, v: &[f64]) -> ScalarValue {
        let item = Arc::new(Field::new_list_field(DataType::Float64, true));
        let values = Arc::new(Float64Array::from(v.to_vec()));
        ScalarValue::FixedSizeList(Arc::new(FixedSizeListArray::new(
            item,
            self.n as i32,
            values,
            None,
        )))
    }

    fn null(&self) -> ScalarValue {
        let item = Arc::new(Field::new_list_field(DataType::Float64, true));
        ScalarValue::FixedSizeList(Arc::new(FixedSizeListArray::new_null(
            item,
            self.n as i32,
            1,
        )))
    }
}

impl Accumulator for DimAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let list = fsl_arg("dim_*", &values[0])?;
        let (n, rows) = (self.n, list.len());
        let all = f64_values(list)?;
        let valid: Vec<usize> = (0..rows).filter(|&r| list.is_valid(r)).collect();
        if valid.is_empty() {
            return Ok(());
        }
        let k = valid.len() as f64;
        let mut mean = vec![0.0; n];
        let mut min = vec![f64::INFINITY; n];
        let mut max = vec![f64::NEG_INFINITY; n];
        for &r in &valid {
            let row = &all[r * n..(r + 1) * n];
            for d in 0..n {
                mean[d] += row[d];
                min[d] = min[d].min(row[d]);
                max[d] = max[d].max(row[d]);
            }
        }
        mean.iter_mut().for_each(|m| *m /= k);
        let mut m2 = vec![0.0; n];
        if self.kind == DimKind::Std {
            for &r in &valid {
                let row = &all[r * n..(r + 1) * n];
                for d in 0..n {
                    let x = row[d] - mean[d];
                    m2[d] += x * x;
                }
            }
        }
        self.merge(valid.len() as u64, &mean, &m2, &min, &max);
        Ok(())
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        Ok(match self.kind {
            _ if self.count == 0 => self.null(),
            DimKind::Mean => self.fsl(&self.mean),
            DimKind::Min => self.fsl(&self.min),
            DimKind::Max => self.fsl(&self.max),
            DimKind::Std if self.count < 2 => self.null(),
            DimKind::Std => {
                let c = (self.count - 1) as f64;
                let v: Vec<f64> = self.m2.iter().map(|m| (m / c).sqrt()).collect();
                self.fsl(&v)
            }
        })
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + 4 * self.n * 8
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::UInt64(Some(self.count)),
            self.fsl(&self.mean),
            self.fsl(&self.m2),
            self.fsl(&self.min),
            self.fsl(&self.max),
        ])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let counts = states[0].as_primitive::<UInt64Type>();
        let n = self.n;
        let vecs = states[1..5]
            .iter()
            .map(|a| f64_values(fsl_arg("dim_*", a)?))
            .collect::<DfResult<Vec<_>>>()?;
        for r in 0..counts.len() {
            if counts.is_null(r) {
                continue;
            }
            let s = |i: usize| &vecs[i][r * n..(r + 1) * n];
            self.merge(counts.value(r), s(0), s(1), s(2), s(3));
        }
        Ok(())
    }
}

/// `discounted_return(reward, step, gamma)`: `sum(gamma^step * reward)` over the group.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct DiscountedReturn {
    signature: Signature,
}

impl DiscountedReturn {
    pub(crate) fn new() -> Self {
        Self {
            signature: Signature::any(3, Volatility::Immutable),
        }
    }
}

impl AggregateUDFImpl for DiscountedReturn {
    fn name(&self) -> &str {
        "discounted_return"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        if !arg_types.iter().all(|t| t.is_numeric()) {
            return Err(DataFusionError::Plan(format!(
                "discounted_return(reward, step, gamma) takes numbers, got ({})",
                arg_types
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(DataType::Float64)
    }
    fn accumulator(&self, _args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        Ok(Box::new(DiscountedAccumulator {
            sum: 0.0,
            any: false,
        }))
    }
    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format!("{}_sum", args.name),
            DataType::Float64,
            true,
        ))])
    }
}

#[derive(Debug)]
pub(crate) struct DiscountedAccumulator {
    sum: f64,
    any: bool,
}

impl Accumulator for DiscountedAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let f = |a: &ArrayRef| cast(a, &DataType::Float64);
        let (r, s, g) = (f(&values[0])?, f(&values[1])?, f(&values[2])?);
        let (r, s, g) = (
            r.as_primitive::<Float64Type>(),
            s.as_primitive::<Float64Type>(),
            g.as_primitive::<Float64Type>(),
        );
        for i in 0..r.len() {
            if r.is_valid(i) && s.is_valid(i) && g.is_valid(i) {
                self.sum += g.value(i).powf(s.value(i)) * r.value(i);
                self.any = true;
            }
        }
        Ok(())
    }
    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        Ok(ScalarValue::Float64(self.any.then_some(self.sum)))
    }
    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }
    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }
    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let s = states[0].as_primitive::<Float64Type>();
        for i in 0..s.len() {
            if s.is_valid(i) {
                self.sum += s.value(i);
                self.any = true;
            }
        }
        Ok(())
    }
}
