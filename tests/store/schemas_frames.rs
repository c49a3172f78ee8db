//! Frame datasets' manifests against `schemas/manifest.schema.json` (the `large_binary` column
//! type and the `frame` object), with the hand-written validator of `schemas.rs`, and the frame
//! description of `schemas/transition.schema.json` against the code.

use serde_json::{Value, json};
use trajstore::Dataset;
use trajstore::format::{self, FRAME_TYPE, meta};
use trajstore::frames::FrameCodec;

use super::frames::{frame_schema, write_episodes};
use super::schemas::{key_set, load, read_json, schema_errors};

/// Every manifest of a dataset of `codec` frames of `shape` (before and after frames), newest
/// last.
fn manifests(codec: FrameCodec, shape: &[usize]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("f.trajstore");
    let ds = Dataset::create(&root, &frame_schema(codec, shape)).unwrap();
    write_episodes(&ds, shape, 3, 20);
    ds.versions()
        .unwrap()
        .into_iter()
        .map(|v| {
            read_json(
                &root
                    .join(format::VERSIONS_DIR)
                    .join(format::manifest_name(v)),
            )
        })
        .collect()
}

#[test]
fn frame_manifests_match_manifest_schema() {
    let schema_json = load("manifest.schema.json");
    let frame_schema_json = &schema_json["$defs"]["frame"];
    let codecs = [FrameCodec::ZstdDict, FrameCodec::Zstd, FrameCodec::None];
    let names: Vec<Value> = codecs.iter().map(|c| json!(c.as_str())).collect();
    assert_eq!(
        frame_schema_json["properties"]["codec"]["enum"],
        json!(names)
    );
    for codec in codecs {
        for shape in [vec![84usize, 84], vec![24, 32, 3]] {
            let all = manifests(codec, &shape);
            assert!(all.len() >= 2, "{codec} {shape:?}");
            for m in &all {
                assert_eq!(
                    schema_errors(&schema_json, m),
                    Vec::<String>::new(),
                    "{codec} {shape:?}: {m}"
                );
                let obs = &m["columns"][6];
                assert_eq!(obs["type"], FRAME_TYPE);
                assert!(obs.get("shape").is_none(), "{obs}");
                assert_eq!(obs["frame"]["shape"], json!(shape));
            }
            // The newest manifest, with frames: its frame object has every key of the schema
            // (the dictionary exactly for zstd-dict).
            let frame = &all.last().unwrap()["columns"][6]["frame"];
            let mut keys = key_set(&frame_schema_json["properties"]);
            if codec != FrameCodec::ZstdDict {
                keys.remove("dictionary");
            }
            assert_eq!(key_set(frame), keys, "{codec}: {frame}");
            if codec == FrameCodec::ZstdDict {
                assert_eq!(
                    key_set(&frame["dictionary"]),
                    key_set(&schema_json["$defs"]["dictionary"]["properties"])
                );
            }
        }
    }
}

#[test]
fn the_structural_check_rejects_bad_frame_columns() {
    let schema_json = load("manifest.schema.json");
    let good = manifests(FrameCodec::ZstdDict, &[84, 84]).pop().unwrap();
    assert!(schema_errors(&schema_json, &good).is_empty());
    let bad = |f: &dyn Fn(&mut Value)| {
        let mut m = good.clone();
        f(&mut m);
        assert!(
            !schema_errors(&schema_json, &m).is_empty(),
            "not rejected: {}",
            m["columns"][6]
        );
    };
    let set = |key: &'static str, v: Value| {
        move |m: &mut Value| m["columns"][6]["frame"][key] = v.clone()
    };
    bad(&set("codec", json!("lz4")));
    bad(&set("codec", json!("ZSTD")));
    bad(&set("shape", json!([7056])));
    bad(&set("shape", json!([84, 84, 3, 1])));
    bad(&set("shape", json!([84, 0])));
    bad(&set("dtype", json!("float32")));
    bad(&set("level", json!("3")));
    bad(&set("extra", json!(1)));
    bad(&|m| {
        m["columns"][6]["frame"]
            .as_object_mut()
            .unwrap()
            .remove("dtype");
    });
    bad(&|m| m["columns"][6]["frame"]["dictionary"]["path"] = json!("dictionaries/ABCDEF01.zdict"));
    bad(&|m| m["columns"][6]["frame"]["dictionary"]["path"] = json!("segments/0badf00d.zdict"));
    bad(&|m| m["columns"][6]["frame"]["dictionary"]["checksum"] = json!("0badf00d"));
    bad(&|m| {
        m["columns"][6]["frame"]["dictionary"]
            .as_object_mut()
            .unwrap()
            .remove("bytes");
    });
    bad(&|m| m["columns"][6]["type"] = json!("binary"));
}

#[test]
fn transition_schema_describes_frame_columns() {
    let t = load("transition.schema.json");
    assert_eq!(t["type_grammar"]["frame"]["type"], FRAME_TYPE);
    assert_eq!(t["metadata"]["field"]["frame_key"], meta::FRAME);
    let f = &t["payload_columns"][0]["frame"];
    assert_eq!(f["type"], FRAME_TYPE);
    assert_eq!(f["nullable"], false);
    assert_eq!(f["metadata_key"], meta::FRAME);
    assert_eq!(
        f["metadata"]["codec"]["values"],
        load("manifest.schema.json")["$defs"]["frame"]["properties"]["codec"]["enum"]
    );
    assert_eq!(f["metadata"]["dtype"], trajstore::frames::FRAME_DTYPE);
    // The metadata object's keys are the frame spec's (as serialized, with a dictionary).
    let m = manifests(FrameCodec::ZstdDict, &[84, 84]).pop().unwrap();
    assert_eq!(key_set(&f["metadata"]), key_set(&m["columns"][6]["frame"]));
    // A frame column of the code: LargeBinary with the same metadata key.
    let schema = frame_schema(FrameCodec::Zstd, &[84, 84]);
    let obs = schema.arrow_schema().field(6);
    assert_eq!(obs.data_type(), &arrow::datatypes::DataType::LargeBinary);
    assert!(obs.metadata().contains_key(meta::FRAME));
}
