//! `schemas/` is the single source of truth of format v1: these tests check that its JSON files
//! and FORMAT.md agree with the code (names, types, order, metadata keys, manifests on disk).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use serde_json::Value;
use trajstore::format::{
    self, FORMAT_NAME, FORMAT_VERSION, ID_DIGITS, IPC_ALIGNMENT, col, ep, meta, parse_type,
    type_name,
};
use trajstore::schema::{fsl, tensor_field};
use trajstore::store::manifest::Manifest;
use trajstore::{Dataset, EpisodeEnd, Error, TransitionSchema, WriterOptions};

fn schemas_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas")
}

pub(super) fn load(name: &str) -> Value {
    let path = schemas_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn s(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, found {v}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected an array, found {v}"))
        .iter()
        .map(|x| s(x).to_string())
        .collect()
}

/// (name, type, nullable) of an Arrow field, the type in the manifest grammar.
fn describe(f: &Field) -> (String, String, bool) {
    let t = type_name(f.data_type()).unwrap_or_else(|| panic!("{}: no grammar type", f.name()));
    (f.name().clone(), t, f.is_nullable())
}

/// (name, type, nullable) of a column object of the JSON files.
fn json_column(c: &Value) -> (String, String, bool) {
    (
        s(&c["name"]).to_string(),
        s(&c["type"]).to_string(),
        c["nullable"].as_bool().expect("nullable is a bool"),
    )
}

fn scalar_type(name: &str) -> DataType {
    let dt = parse_type(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(!matches!(dt, DataType::FixedSizeList(..)), "{name}");
    dt
}

#[test]
fn format_name_and_version_agree() {
    for file in ["transition.schema.json", "episodes.schema.json"] {
        let v = load(file);
        assert_eq!(s(&v["format"]), FORMAT_NAME, "{file}");
        assert_eq!(
            v["format_version"].as_u64(),
            Some(FORMAT_VERSION as u64),
            "{file}"
        );
    }
    let m = load("manifest.schema.json");
    assert_eq!(
        s(&m["$schema"]),
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert_eq!(s(&m["properties"]["format"]["const"]), FORMAT_NAME);
    assert_eq!(
        m["properties"]["format_version"]["const"].as_u64(),
        Some(FORMAT_VERSION as u64)
    );
}

#[test]
fn layout_constants_agree() {
    let t = load("transition.schema.json");
    let l = &t["layout"];
    assert_eq!(s(&l["versions_dir"]), format::VERSIONS_DIR);
    assert_eq!(s(&l["segments_dir"]), format::SEGMENTS_DIR);
    assert_eq!(s(&l["lock_file"]), format::LOCK_FILE);
    assert_eq!(s(&l["segment_suffix"]), format::SEGMENT_SUFFIX);
    assert_eq!(s(&l["episodes_suffix"]), format::EPISODES_SUFFIX);
    assert_eq!(s(&l["manifest_suffix"]), format::MANIFEST_SUFFIX);
    assert_eq!(s(&l["tmp_suffix"]), format::TMP_SUFFIX);
    assert_eq!(l["id_digits"].as_u64(), Some(ID_DIGITS as u64));
    assert_eq!(l["ipc_alignment"].as_u64(), Some(IPC_ALIGNMENT as u64));
    assert_eq!(s(&l["metadata_version"]), "V5");
    assert!(l["compression"].is_null());
    assert_eq!(l["dictionaries"], Value::Bool(false));
    assert_eq!(s(&t["file"]["kind"]), meta::KIND_TRANSITIONS);
    assert_eq!(
        s(&load("episodes.schema.json")["file"]["kind"]),
        meta::KIND_EPISODES
    );
    assert_eq!(
        format::manifest_name(1).len(),
        ID_DIGITS + format::MANIFEST_SUFFIX.len()
    );
    assert_eq!(format::segment_name(7).len(), ID_DIGITS);
}

#[test]
fn boundary_columns_agree() {
    let t = load("transition.schema.json");
    let boundary: Vec<_> = t["boundary_columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(json_column)
        .collect();
    let names: Vec<_> = boundary.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, col::BOUNDARY);
    assert!(
        boundary.iter().all(|c| !c.2),
        "boundary columns are non-nullable"
    );
    for c in t["boundary_columns"].as_array().unwrap() {
        assert!(!s(&c["meaning"]).is_empty());
    }
    let schema = TransitionSchema::builder(&[3], 2).build().unwrap();
    let fields = schema.arrow_schema().fields();
    let built: Vec<_> = fields
        .iter()
        .take(col::BOUNDARY.len())
        .map(|f| describe(f))
        .collect();
    assert_eq!(built, boundary);
    for (name, ty, _) in &boundary {
        assert_eq!(&type_name(&parse_type(ty).unwrap()).unwrap(), ty, "{name}");
    }
}

#[test]
fn payload_columns_agree() {
    let t = load("transition.schema.json");
    let payload = t["payload_columns"].as_array().unwrap();
    let names: Vec<_> = payload.iter().map(|c| s(&c["name"])).collect();
    assert_eq!(
        names,
        [
            col::OBSERVATION,
            col::ACTION,
            col::REWARD,
            col::NEXT_OBSERVATION
        ]
    );
    let required: Vec<_> = payload
        .iter()
        .map(|c| c["required"].as_bool().unwrap())
        .collect();
    assert_eq!(required, [true, true, true, false]);
    assert!(payload.iter().all(|c| c["nullable"] == Value::Bool(false)));

    // The canonical order with and without next_observation.
    let without = TransitionSchema::builder(&[3], 2).build().unwrap();
    let with = TransitionSchema::builder(&[3], 2)
        .next_observation(true)
        .build()
        .unwrap();
    for (schema, n) in [(&without, 3), (&with, 4)] {
        let got: Vec<_> = schema
            .arrow_schema()
            .fields()
            .iter()
            .skip(6)
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(got, names[..n]);
    }
    let obs = with.arrow_schema().field(6);
    let next = with.arrow_schema().field(9);
    assert_eq!(describe(obs).1, "fixed_size_list<float32>[3]");
    assert_eq!(
        describe(next),
        (col::NEXT_OBSERVATION.to_string(), describe(obs).1, false)
    );
    assert_eq!(next.metadata(), obs.metadata());
    assert_eq!(
        describe(with.arrow_schema().field(7)).1,
        "fixed_size_list<float32>[2]"
    );
    let reward = &payload[2];
    assert_eq!(describe(with.arrow_schema().field(8)), json_column(reward));

    // observation: a fixed_size_list of exactly the listed element types, with tensor metadata.
    let observation = &payload[0];
    let obs_md = observation["metadata"].as_object().unwrap();
    let keys: BTreeSet<_> = obs_md.keys().map(String::as_str).collect();
    let have: BTreeSet<_> = obs.metadata().keys().map(String::as_str).collect();
    assert_eq!(keys, have);
    assert_eq!(
        keys,
        BTreeSet::from([meta::EXTENSION_NAME, meta::EXTENSION_METADATA])
    );
    assert_eq!(s(&obs_md[meta::EXTENSION_NAME]), meta::FIXED_SHAPE_TENSOR);
    assert_eq!(
        obs.metadata()[meta::EXTENSION_NAME],
        meta::FIXED_SHAPE_TENSOR
    );
    let shape: Value = serde_json::from_str(&obs.metadata()[meta::EXTENSION_METADATA]).unwrap();
    assert_eq!(shape, serde_json::json!({ "shape": [3] }));
    let obs_elems = strings(&observation["element_types"]);
    for name in strings(&t["type_grammar"]["scalar"]) {
        let built = TransitionSchema::builder(&[2, 2], 2)
            .observation(scalar_type(&name), &[2, 2])
            .build();
        assert_eq!(
            built.is_ok(),
            obs_elems.contains(&name),
            "observation of {name}"
        );
    }

    // action: a fixed_size_list of the listed float types, or int64.
    let action = &payload[1];
    let act_elems = strings(&action["element_types"]);
    assert_eq!(s(&action["discrete_type"]), "int64");
    let discrete = TransitionSchema::builder(&[3], 1)
        .discrete_action()
        .build()
        .unwrap();
    assert_eq!(describe(discrete.arrow_schema().field(7)).1, "int64");
    let with_action = |dt: DataType| {
        TransitionSchema::from_payload(&Schema::new(vec![
            tensor_field(col::OBSERVATION, DataType::Float32, &[3], false).unwrap(),
            Field::new(col::ACTION, dt, false),
            Field::new(col::REWARD, DataType::Float32, false),
        ]))
    };
    for name in strings(&t["type_grammar"]["scalar"]) {
        let dt = scalar_type(&name);
        let list = with_action(fsl(dt.clone(), 2).unwrap());
        assert_eq!(
            list.is_ok(),
            act_elems.contains(&name),
            "action list of {name}"
        );
        assert_eq!(
            with_action(dt).is_ok(),
            name == "int64",
            "scalar action of {name}"
        );
    }
}

#[test]
fn type_grammar_and_user_columns_agree() {
    let t = load("transition.schema.json");
    let g = &t["type_grammar"];
    let scalars = strings(&g["scalar"]);
    let elems = strings(&g["list_element"]);
    assert_eq!(s(&g["list"]), "fixed_size_list<T>[n]");
    let mut candidates = scalars.clone();
    candidates.extend(
        [
            "utf8",
            "binary",
            "date32",
            "list<float32>",
            "fixed_size_list<float32>[0]",
        ]
        .map(String::from),
    );
    for name in &scalars {
        let dt = parse_type(name).unwrap();
        assert_eq!(&type_name(&dt).unwrap(), name);
        let list = format!("fixed_size_list<{name}>[4]");
        assert_eq!(parse_type(&list).is_ok(), elems.contains(name), "{list}");
        if elems.contains(name) {
            candidates.push(list);
        }
    }
    for bad in [
        "utf8",
        "binary",
        "list<float32>",
        "fixed_size_list<float32>[0]",
        "bool8",
    ] {
        let e = parse_type(bad).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "type"),
            "{bad}: {e}"
        );
    }
    // User columns: every type of the grammar is accepted (nullable too), nothing else.
    for name in &candidates {
        let Ok(dt) = parse_type(name) else { continue };
        for nullable in [false, true] {
            let built = TransitionSchema::builder(&[3], 2)
                .column(Field::new("user", dt.clone(), nullable))
                .build()
                .unwrap_or_else(|e| panic!("user column {name}: {e}"));
            let f = built.arrow_schema().fields().last().unwrap();
            assert_eq!(describe(f), ("user".to_string(), name.clone(), nullable));
        }
    }
    let string_col = TransitionSchema::builder(&[3], 2)
        .column(Field::new("note", DataType::Utf8, true))
        .build();
    let e = string_col.unwrap_err();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
    let boundary_name = TransitionSchema::builder(&[3], 2)
        .column(Field::new(col::STEP, DataType::UInt32, false))
        .build();
    let e = boundary_name.unwrap_err();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
}

#[test]
fn metadata_keys_agree() {
    let t = load("transition.schema.json");
    let field = &t["metadata"]["field"];
    assert_eq!(s(&field["extension_name_key"]), meta::EXTENSION_NAME);
    assert_eq!(
        s(&field["extension_metadata_key"]),
        meta::EXTENSION_METADATA
    );
    assert_eq!(s(&field["fixed_shape_tensor"]), meta::FIXED_SHAPE_TENSOR);
    let footer = t["metadata"]["footer"]["keys"].as_array().unwrap();
    let keys: Vec<_> = footer.iter().map(|k| s(&k["key"])).collect();
    assert_eq!(
        keys,
        [meta::FORMAT_VERSION, meta::FILE_KIND, meta::SEGMENT_ID]
    );
    assert_eq!(
        strings(&footer[1]["values"]),
        [meta::KIND_TRANSITIONS, meta::KIND_EPISODES]
    );
    let e = load("episodes.schema.json");
    let ep_footer = e["footer_metadata"].as_object().unwrap();
    let ep_keys: BTreeSet<_> = ep_footer.keys().map(String::as_str).collect();
    assert_eq!(
        ep_keys,
        BTreeSet::from([meta::FORMAT_VERSION, meta::FILE_KIND, meta::SEGMENT_ID])
    );
    assert_eq!(s(&ep_footer[meta::FILE_KIND]), meta::KIND_EPISODES);
    assert_eq!(
        s(&ep_footer[meta::FORMAT_VERSION]),
        FORMAT_VERSION.to_string()
    );
}

#[test]
fn episode_table_agrees() {
    let e = load("episodes.schema.json");
    let cols = e["columns"].as_array().unwrap();
    let names: Vec<_> = cols.iter().map(|c| s(&c["name"])).collect();
    assert_eq!(
        names,
        [
            ep::EPISODE_ID,
            ep::ROW_START,
            ep::LENGTH,
            ep::EPISODE_RETURN,
            ep::TERMINATED,
            ep::TRUNCATED,
            ep::FINAL_OBSERVATION
        ]
    );
    let fixed: Vec<_> = cols[..6].iter().map(json_column).collect();
    for obs_shape in [&[3][..], &[2, 4][..]] {
        let derived = TransitionSchema::builder(obs_shape, 2).build().unwrap();
        let stored = TransitionSchema::builder(obs_shape, 2)
            .next_observation(true)
            .build()
            .unwrap();
        // Without next_observation: the six columns plus a nullable final_observation typed and
        // tagged like observation.
        let d = derived.episode_schema();
        assert_eq!(d.fields().len(), 7);
        let got: Vec<_> = d.fields().iter().take(6).map(|f| describe(f)).collect();
        assert_eq!(got, fixed);
        let fin = d.field(6);
        let obs = derived.observation_field();
        assert_eq!(fin.name(), ep::FINAL_OBSERVATION);
        assert_eq!(cols[6]["nullable"], Value::Bool(true));
        assert!(fin.is_nullable());
        assert_eq!(fin.data_type(), obs.data_type());
        assert_eq!(fin.metadata(), obs.metadata());
        // With next_observation: exactly the six columns.
        let got: Vec<_> = stored
            .episode_schema()
            .fields()
            .iter()
            .map(|f| describe(f))
            .collect();
        assert_eq!(got, fixed);
    }
}

#[test]
fn format_md_mentions_every_name() {
    let path = schemas_dir().join("FORMAT.md");
    let md = std::fs::read_to_string(&path).unwrap();
    let mut names = vec![
        col::EPISODE_ID,
        col::STEP,
        col::IS_FIRST,
        col::IS_LAST,
        col::TERMINATED,
        col::TRUNCATED,
        col::OBSERVATION,
        col::ACTION,
        col::REWARD,
        col::NEXT_OBSERVATION,
        ep::EPISODE_ID,
        ep::ROW_START,
        ep::LENGTH,
        ep::EPISODE_RETURN,
        ep::TERMINATED,
        ep::TRUNCATED,
        ep::FINAL_OBSERVATION,
        meta::EXTENSION_NAME,
        meta::EXTENSION_METADATA,
        meta::FIXED_SHAPE_TENSOR,
        meta::FORMAT_VERSION,
        meta::SEGMENT_ID,
        meta::FILE_KIND,
        meta::KIND_TRANSITIONS,
        meta::KIND_EPISODES,
        format::VERSIONS_DIR,
        format::SEGMENTS_DIR,
        format::LOCK_FILE,
        format::SEGMENT_SUFFIX,
        format::EPISODES_SUFFIX,
        format::TMP_SUFFIX,
        FORMAT_NAME,
    ];
    let manifest = load("manifest.schema.json");
    let keys: Vec<String> = [
        "properties",
        "$defs/segment/properties",
        "$defs/column/properties",
    ]
    .iter()
    .flat_map(|p| {
        let node = p.split('/').fold(&manifest, |v, k| &v[k]);
        node.as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    })
    .collect();
    names.extend(keys.iter().map(String::as_str));
    for name in names {
        assert!(
            md.contains(&format!("`{name}")),
            "FORMAT.md does not mention `{name}`"
        );
    }
    for fact in [
        "ARROW1",
        "0xFFFFFFFF",
        "V5",
        "crc32c:%08x",
        "flock",
        "keep_versions",
        "max_transitions",
    ] {
        let fact = if fact == "0xFFFFFFFF" {
            "FF FF FF FF"
        } else {
            fact
        };
        assert!(md.contains(fact), "FORMAT.md does not mention {fact}");
    }
    assert!(md.contains(&format!("{IPC_ALIGNMENT}-byte alignment")));
    assert!(md.contains(&format::manifest_name(1)));
    assert!(md.contains(&format!(
        "{}{}",
        format::segment_name(0),
        format::EPISODES_SUFFIX
    )));
}

// ---------------------------------------------------------------------------------------------
// Manifests on disk against manifest.schema.json.

/// A small subset of JSON Schema 2020-12: `$ref` (local), `type`, `const`, `enum`, `minimum`,
/// `maximum`, `minLength`, `minItems`, `maxItems`, `pattern` (the patterns of manifest.schema.json only), `properties`,
/// `required`, `additionalProperties`, `items`. Returns every violation as `path: reason`.
fn validate(root: &Value, schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
    let at = |why: String| format!("{path}: {why}");
    if let Some(r) = schema.get("$ref") {
        let target = s(r).strip_prefix("#/").expect("local $ref");
        let sub = target.split('/').fold(root, |n, k| &n[k]);
        assert!(!sub.is_null(), "dangling $ref {target}");
        validate(root, sub, v, path, errors);
    }
    if let Some(t) = schema.get("type") {
        let ok = match s(t) {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "boolean" => v.is_boolean(),
            "integer" => v.is_u64() || v.is_i64(),
            "number" => v.is_number(),
            "null" => v.is_null(),
            other => panic!("unknown type {other}"),
        };
        if !ok {
            errors.push(at(format!("{v} is not of type {}", s(t))));
            return;
        }
    }
    if let Some(c) = schema.get("const")
        && c != v
    {
        errors.push(at(format!("{v} is not {c}")));
    }
    if let Some(e) = schema.get("enum")
        && !e.as_array().expect("enum is an array").contains(v)
    {
        errors.push(at(format!("{v} is not one of {e}")));
    }
    if let Some(min) = schema.get("minimum").and_then(Value::as_u64)
        && v.as_u64().is_none_or(|x| x < min)
    {
        errors.push(at(format!("{v} is below {min}")));
    }
    if let Some(max) = schema.get("maximum") {
        let max = max.as_u64().expect("u64 maximum");
        if v.as_u64().is_none_or(|x| x > max) {
            errors.push(at(format!("{v} is above {max}")));
        }
    }
    if let Some(n) = schema.get("minLength").and_then(Value::as_u64)
        && v.as_str().is_some_and(|x| (x.chars().count() as u64) < n)
    {
        errors.push(at(format!("{v} is shorter than {n}")));
    }
    if let Some(p) = schema.get("pattern")
        && let Some(x) = v.as_str()
        && !matches_pattern(s(p), x)
    {
        errors.push(at(format!("{v} does not match {p}")));
    }
    if let Some(arr) = v.as_array() {
        if let Some(n) = schema.get("minItems").and_then(Value::as_u64)
            && (arr.len() as u64) < n
        {
            errors.push(at(format!("{} items, fewer than {n}", arr.len())));
        }
        if let Some(n) = schema.get("maxItems").and_then(Value::as_u64)
            && (arr.len() as u64) > n
        {
            errors.push(at(format!("{} items, more than {n}", arr.len())));
        }
        if let Some(items) = schema.get("items") {
            for (i, x) in arr.iter().enumerate() {
                validate(root, items, x, &format!("{path}[{i}]"), errors);
            }
        }
    }
    if let Some(obj) = v.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        for key in schema.get("required").map(strings).unwrap_or_default() {
            if !obj.contains_key(&key) {
                errors.push(format!("{path}: missing required `{key}`"));
            }
        }
        for (key, x) in obj {
            let sub = format!("{path}.{key}");
            match (
                props.and_then(|p| p.get(key)),
                schema.get("additionalProperties"),
            ) {
                (Some(p), _) => validate(root, p, x, &sub, errors),
                (None, Some(Value::Bool(false))) => {
                    errors.push(format!("{path}: unknown key `{key}`"))
                }
                (None, Some(extra)) => validate(root, extra, x, &sub, errors),
                (None, None) => {}
            }
        }
    }
}

/// The regular expressions used in manifest.schema.json, implemented by hand (no regex crate).
fn matches_pattern(pattern: &str, x: &str) -> bool {
    let digits = |d: &str, n: usize| d.len() == n && d.bytes().all(|b| b.is_ascii_digit());
    let segment = |suffix: &str| {
        x.strip_prefix("segments/")
            .and_then(|r| r.strip_suffix(suffix))
            .is_some_and(|d| digits(d, ID_DIGITS))
    };
    match pattern {
        "^crc32c:[0-9a-f]{8}$" => x.strip_prefix("crc32c:").is_some_and(|h| {
            h.len() == 8 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        }),
        r"^segments/[0-9]{20}\.arrow$" => segment(".arrow"),
        r"^segments/[0-9]{20}\.episodes\.arrow$" => segment(".episodes.arrow"),
        r"^dictionaries/[0-9a-f]{8}\.zdict$" => x
            .strip_prefix("dictionaries/")
            .and_then(|r| r.strip_suffix(".zdict"))
            .is_some_and(|h| {
                h.len() == 8 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            }),
        r"^(bool|u?int(8|16|32|64)|float(16|32|64)|large_binary|fixed_size_list<(u?int(8|16|32|64)|float(16|32|64))>\[[1-9][0-9]*\])$" => {
            x == format::FRAME_TYPE
                || parse_type(x).is_ok_and(|dt| type_name(&dt).as_deref() == Some(x))
        }
        other => {
            panic!("pattern {other} is not known to this test; teach matches_pattern about it")
        }
    }
}

pub(super) fn schema_errors(schema: &Value, manifest: &Value) -> Vec<String> {
    let mut errors = vec![];
    validate(schema, schema, manifest, "$", &mut errors);
    errors
}

pub(super) fn key_set(v: &Value) -> BTreeSet<String> {
    v.as_object().expect("object").keys().cloned().collect()
}

pub(super) fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn float_list(n: i32, values: Vec<f32>) -> ArrayRef {
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    Arc::new(FixedSizeListArray::new(
        item,
        n,
        Arc::new(Float32Array::from(values)),
        None,
    ))
}

fn episode(rows: usize) -> RecordBatch {
    RecordBatch::try_from_iter([
        (col::OBSERVATION, float_list(3, vec![0.25; rows * 3])),
        (col::ACTION, float_list(2, vec![1.0; rows * 2])),
        (
            col::REWARD,
            Arc::new(Float32Array::from(vec![0.5; rows])) as ArrayRef,
        ),
    ])
    .unwrap()
}

#[test]
fn manifests_written_by_the_code_match_manifest_schema() {
    let schema_json = load("manifest.schema.json");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("d.trajstore");
    let schema = TransitionSchema::builder(&[3], 2).build().unwrap();
    let ds = Dataset::create(&root, &schema).unwrap();
    let versions = root.join(format::VERSIONS_DIR);
    assert!(root.join(format::SEGMENTS_DIR).is_dir());

    // Version 1: what Dataset::create publishes.
    let v1 = read_json(&versions.join("00000000000000000001.json"));
    assert_eq!(format::manifest_name(1), "00000000000000000001.json");
    assert_eq!(schema_errors(&schema_json, &v1), Vec::<String>::new());
    let top = key_set(&schema_json["properties"]);
    assert_eq!(
        key_set(&v1),
        top,
        "manifest keys must be exactly the schema's properties"
    );
    let required: BTreeSet<_> = strings(&schema_json["required"]).into_iter().collect();
    assert!(required.is_subset(&top));
    assert_eq!(
        top.difference(&required).collect::<Vec<_>>(),
        ["properties"],
        "only `properties` has a serde default"
    );
    assert_eq!(schema_json["additionalProperties"], Value::Bool(false));
    let parsed: Manifest = serde_json::from_value(v1.clone()).unwrap();
    assert_eq!(parsed.version, 1);
    assert_eq!(
        v1["columns"],
        serde_json::to_value(schema.to_columns()).unwrap()
    );

    // Manifest columns agree with transition.schema.json.
    let t = load("transition.schema.json");
    let boundary: Vec<_> = t["boundary_columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(json_column)
        .collect();
    let cols: Vec<_> = v1["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(json_column)
        .collect();
    assert_eq!(cols[..6], boundary[..]);
    let obs = &v1["columns"][6];
    assert_eq!(s(&obs["name"]), col::OBSERVATION);
    assert_eq!(obs["shape"], serde_json::json!([3]));
    assert!(
        v1["columns"][7].get("shape").is_none(),
        "action carries no tensor metadata"
    );

    // Version 2: one committed segment of two episodes.
    let mut w = ds.writer(WriterOptions::default()).unwrap();
    w.append_episode(&episode(4), EpisodeEnd::terminated())
        .unwrap();
    w.append_episode(
        &episode(2),
        EpisodeEnd::truncated().with_final_observation(float_list(3, vec![9.0; 3])),
    )
    .unwrap();
    w.set_property("source", "tests/schemas.rs");
    assert_eq!(w.commit().unwrap(), 2);
    drop(w);
    assert!(root.join(format::LOCK_FILE).is_file());
    let v2 = read_json(&versions.join(format::manifest_name(2)));
    assert_eq!(schema_errors(&schema_json, &v2), Vec::<String>::new());
    assert_eq!(key_set(&v2), top);
    let seg_schema = &schema_json["$defs"]["segment"];
    let seg = &v2["segments"][0];
    assert_eq!(key_set(seg), key_set(&seg_schema["properties"]));
    assert_eq!(
        key_set(seg),
        strings(&seg_schema["required"]).into_iter().collect()
    );
    let col_schema = &schema_json["$defs"]["column"];
    let col_keys: BTreeSet<String> = v2["columns"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(key_set)
        .collect();
    // Every key but `frame`, which only frame columns have (schemas_frames.rs).
    let mut keys = key_set(&col_schema["properties"]);
    assert!(keys.remove("frame"));
    assert_eq!(col_keys, keys);
    for c in v2["columns"].as_array().unwrap() {
        assert!(
            strings(&col_schema["required"])
                .iter()
                .all(|k| c.get(k).is_some())
        );
    }
    assert_eq!(v2["properties"]["source"], "tests/schemas.rs");

    // The files the manifest names: sizes, checksums and footer metadata as documented.
    let m: Manifest = serde_json::from_value(v2.clone()).unwrap();
    let entry = &m.segments[0];
    assert_eq!(
        (
            entry.rows,
            entry.episodes,
            entry.first_row,
            entry.first_episode_id
        ),
        (6, 2, 0, 0)
    );
    let ep_schema = load("episodes.schema.json");
    let footer_keys: BTreeSet<String> = key_set(&ep_schema["footer_metadata"]);
    for (rel, bytes, checksum, expected, kind) in [
        (
            &entry.path,
            entry.bytes,
            &entry.checksum,
            schema.arrow_schema(),
            meta::KIND_TRANSITIONS,
        ),
        (
            &entry.episodes_path,
            entry.episodes_bytes,
            &entry.episodes_checksum,
            schema.episode_schema(),
            meta::KIND_EPISODES,
        ),
    ] {
        let path = root.join(rel);
        let data = std::fs::read(&path).unwrap();
        assert_eq!(data.len() as u64, bytes);
        assert_eq!(&data[..6], b"ARROW1");
        assert!(
            data[6..IPC_ALIGNMENT].iter().all(|&b| b == 0),
            "magic padded with zeros to 64 bytes"
        );
        assert_eq!(
            &data[IPC_ALIGNMENT..IPC_ALIGNMENT + 4],
            &[0xff; 4],
            "schema message at offset 64"
        );
        assert_eq!(&data[data.len() - 6..], b"ARROW1");
        let ipc = trajstore::store::ipc::open_ipc(&path, expected).unwrap();
        let keys: BTreeSet<String> = ipc.metadata.keys().cloned().collect();
        assert_eq!(keys, footer_keys, "{rel}");
        assert_eq!(
            ipc.metadata[meta::FORMAT_VERSION],
            FORMAT_VERSION.to_string()
        );
        assert_eq!(ipc.metadata[meta::FILE_KIND], kind);
        assert_eq!(
            ipc.metadata[meta::SEGMENT_ID],
            format::segment_name(entry.id)
        );
        assert!(matches_pattern("^crc32c:[0-9a-f]{8}$", checksum));
        assert_eq!(
            &trajstore::store::ipc::checksum_string(crc32c_of(&data)),
            checksum
        );
    }
    assert!(
        std::fs::read_dir(root.join(format::SEGMENTS_DIR))
            .unwrap()
            .all(|e| {
                !e.unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(format::TMP_SUFFIX)
            })
    );
}

/// CRC-32C (Castagnoli), bitwise, as FORMAT.md specifies it: reflected polynomial 0x82F63B78,
/// initial value and final XOR 0xFFFFFFFF.
fn crc32c_of(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn crc32c_check_value_is_as_documented() {
    assert_eq!(crc32c_of(b"123456789"), 0xE306_9283);
    let md = std::fs::read_to_string(schemas_dir().join("FORMAT.md")).unwrap();
    assert!(md.contains("0xE3069283") && md.contains("0x82F63B78"));
}

#[test]
fn the_structural_check_rejects_bad_manifests() {
    let schema_json = load("manifest.schema.json");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("d.trajstore");
    let ds = Dataset::create(&root, &TransitionSchema::builder(&[2], 1).build().unwrap()).unwrap();
    let mut w = ds.writer(WriterOptions::default()).unwrap();
    let batch = RecordBatch::try_from_iter([
        (col::OBSERVATION, float_list(2, vec![0.0; 6])),
        (col::ACTION, float_list(1, vec![0.0; 3])),
        (
            col::REWARD,
            Arc::new(Float32Array::from(vec![1.0; 3])) as ArrayRef,
        ),
    ])
    .unwrap();
    w.append_episode(&batch, EpisodeEnd::terminated()).unwrap();
    w.commit().unwrap();
    let good = read_json(
        &root
            .join(format::VERSIONS_DIR)
            .join(format::manifest_name(2)),
    );
    assert!(schema_errors(&schema_json, &good).is_empty());
    let bad = |f: &dyn Fn(&mut Value)| {
        let mut m = good.clone();
        f(&mut m);
        let errors = schema_errors(&schema_json, &m);
        assert!(!errors.is_empty(), "not rejected: {m}");
    };
    bad(&|m| {
        m.as_object_mut().unwrap().remove("next_row");
    });
    bad(&|m| m["unknown"] = Value::from(1));
    bad(&|m| m["format"] = Value::from("other"));
    bad(&|m| m["format_version"] = Value::from(2));
    bad(&|m| m["transitions"] = Value::from(-1));
    bad(&|m| m["transitions"] = Value::from("3"));
    bad(&|m| m["version"] = Value::from(0));
    bad(&|m| m["properties"]["k"] = Value::from(1));
    bad(&|m| m["segments"][0]["checksum"] = Value::from("crc32c:ABCDEF01"));
    bad(&|m| m["segments"][0]["episodes_checksum"] = Value::from("crc32:00000000"));
    bad(&|m| m["segments"][0]["path"] = Value::from("../00000000000000000000.arrow"));
    bad(&|m| {
        m["segments"][0]["episodes_path"] = Value::from("segments/00000000000000000000.arrow")
    });
    bad(&|m| m["segments"][0]["rows"] = Value::from(0));
    bad(&|m| m["segments"][0]["extra"] = Value::from(0));
    bad(&|m| {
        m["segments"][0]
            .as_object_mut()
            .unwrap()
            .remove("first_row");
    });
    bad(&|m| m["columns"][6]["type"] = Value::from("fixed_size_list<bool>[2]"));
    bad(&|m| m["columns"][6]["type"] = Value::from("utf8"));
    bad(&|m| m["columns"][6]["shape"] = serde_json::json!([0]));
    bad(&|m| m["columns"][0]["nullable"] = Value::from("no"));
    bad(&|m| m["columns"] = serde_json::json!([]));
}
