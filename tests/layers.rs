//! The library's modules depend on each other one way only, in the order ARCHITECTURE.md gives:
//! every `crate::<module>` path in a module's files names the module itself or one listed before
//! it. This reads the sources (no build-time magic), so a new `use` that points backwards, and
//! with it a cycle, fails here with the file and line.

use std::path::{Path, PathBuf};

/// Bottom to top. A module may use those before it; `fault` (crash points) and `guard` (quiet panic catching) may be used by all.
const ORDER: &[&str] = &[
    "error", "progress", "iofloor", "format", "schema", "stats", "index", "store", "synth",
    "ingest", "sample", "gather", "loader", "torch", "remote", "open", "sql",
];
const ANYWHERE: &[&str] = &["fault", "guard", "Error", "Result"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a library file belongs to (`src/store/writer/mod.rs` → `store`,
/// `src/gather/mod.rs` → `gather`, `src/error.rs` → `error`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "bin" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// Every `crate::<name>` in `text` outside comments, with its line number.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = vec![];
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let before = rest[..i].chars().last();
            rest = &rest[i + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue; // `$crate::` in macros, or an identifier ending in `crate`
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push((n + 1, name));
        }
    }
    out
}

#[test]
fn library_modules_depend_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    rust_files(&src, &mut files);
    let rank = |m: &str| ORDER.iter().position(|x| *x == m);
    let mut backwards = vec![];
    let mut checked = 0;
    for f in &files {
        let Some(module) = module_of(&src, f) else {
            continue;
        };
        if ANYWHERE.contains(&module.as_str()) {
            continue;
        }
        let own = rank(&module).unwrap_or_else(|| {
            panic!(
                "{}: module `{module}` is not in ORDER (tests/layers.rs, ARCHITECTURE.md)",
                f.display()
            )
        });
        let text = std::fs::read_to_string(f).unwrap();
        for (line, used) in crate_paths(&text) {
            checked += 1;
            if ANYWHERE.contains(&used.as_str()) {
                continue;
            }
            match rank(&used) {
                Some(r) if r <= own => {}
                Some(_) => backwards.push(format!(
                    "{}:{line}: `{module}` uses `crate::{used}`, which is above it",
                    f.display()
                )),
                None => backwards.push(format!(
                    "{}:{line}: `crate::{used}` is not a module in ORDER",
                    f.display()
                )),
            }
        }
    }
    assert!(
        checked > 100,
        "found only {checked} crate:: paths: is src/ where it should be?"
    );
    assert!(
        backwards.is_empty(),
        "dependencies that point backwards:\n{}",
        backwards.join("\n")
    );
}

#[test]
fn the_check_sees_a_backwards_use() {
    // The scanner itself: a path in code counts, one in a comment or `$crate::` does not.
    let text = "use crate::store::Snapshot; // crate::sql\nlet x = $crate::output::emit;";
    assert_eq!(crate_paths(text), vec![(1, "store".to_string())]);
}

#[test]
fn no_library_file_is_over_800_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    rust_files(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            // Unit tests at the end of a file do not count against its size.
            let code = text
                .split("#[cfg(test)]\nmod tests")
                .next()
                .unwrap_or(&text);
            let n = code.lines().count();
            (n > 800).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these files:\n{}", long.join("\n"));
}
