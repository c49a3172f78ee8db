//! The library's modules depend on each other one way only, in the order ARCHITECTURE.md gives:
//! every `crate::<module>` path in a module's files names the module itself or one listed before
//! it. Inside each folder the same holds for its files, in the order [`FOLDERS`] gives. This reads
//! the sources (no build-time magic), so a new `use` that points backwards, and with it a cycle,
//! fails here with the file and line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Bottom to top. A module may use those before it; `fault` (crash points) and `guard` (quiet panic catching) may be used by all.
const ORDER: &[&str] = &[
    "error", "units", "progress", "iofloor", "format", "frames", "video", "schema", "stats",
    "index", "store", "remote", "open", "synth", "ingest", "sample", "gather", "loader", "torch",
    "sql",
];
const ANYWHERE: &[&str] = &["fault", "guard", "Error", "Result"];

/// Inside each folder of `src/`, its files (a subfolder by its name) bottom to top: a file may use
/// the files listed before it, through `super::`, `crate::<module>::` or a name the folder's
/// `mod.rs` imports from a file (`use x::Name`, `pub use x::Name`, `use x::*`; also seen through a
/// `use super::*`). `mod.rs` is the folder itself: it uses its files, and they may use the items
/// it defines (the folder's shared traits and helpers). Unit tests (`tests.rs`, or the
/// `#[cfg(test)] mod tests` at a file's end) may use any file of their folder.
const FOLDERS: &[(&str, &[&str])] = &[
    (
        "gather",
        &[
            "batch",
            "readahead",
            "simd",
            "frame_cache",
            "frames",
            "stored",
            "pages",
            "into",
            "mix",
        ],
    ),
    ("index", &["episode", "slice"]),
    (
        "ingest",
        &[
            "image",
            "target",
            "source",
            "conventions",
            "unstack",
            "mapping",
            "convert",
            "assemble",
        ],
    ),
    (
        "ingest/source",
        &[
            "npy",
            "dqn",
            "rlds",
            "zip",
            "array",
            "npz_dir",
            "hdf5",
            "torchrl",
            "parquet",
            "lerobot",
            "arrow_ipc",
        ],
    ),
    (
        "ingest/source/rlds",
        &["tfrecord", "example", "features", "plan", "episode"],
    ),
    (
        "loader",
        &[
            "state", "spec", "feed", "pipeline", "ring", "stream", "staged",
        ],
    ),
    (
        "loader/stream",
        &[
            "columns", "schedule", "cache", "subset", "runs", "mixed", "loader",
        ],
    ),
    ("remote", &["mirror", "push", "pull", "stream"]),
    (
        "sample",
        &["spec", "slice", "episode", "epoch", "prioritized", "mix"],
    ),
    (
        "sql",
        &[
            "readahead",
            "functions",
            "limits",
            "sized",
            "episode_agg",
            "table",
            "remote_scan",
            "cluster_tables",
            "ballista",
        ],
    ),
    (
        "store",
        &[
            "ipc",
            "manifest",
            "dictionary",
            "episode",
            "segment",
            "writer",
            "dataset",
            "info",
            "verify",
            "export",
        ],
    ),
    ("store/writer", &["cleanup", "frames"]),
    (
        "torch",
        &[
            "events",
            "kernel",
            "layout",
            "compact",
            "device_ring",
            "frame_decode",
            "options",
            "times",
            "resident_ring",
            "resident",
            "handover",
            "streaming",
            "loader",
        ],
    ),
    ("video", &["mp4", "yuv", "av1", "h264"]),
];

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

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The module path of a library file (`src/store/writer/mod.rs` → `[store, writer]`,
/// `src/gather/mix.rs` → `[gather, mix]`, `src/error.rs` → `[error]`); `None` for `lib.rs` and the
/// binary.
fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts[0] == "lib" || parts[0] == "bin" {
        return None;
    }
    if parts.len() > 1 && parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    Some(parts)
}

/// `text` with comments and string and character literals blanked out (lines kept), so that
/// only code is scanned.
fn code_of(text: &str) -> String {
    let s = text.as_bytes();
    let mut out = s.to_vec();
    let blank = |out: &mut Vec<u8>, a: usize, b: usize| {
        for c in &mut out[a..b.min(s.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|&c| c == b'\n')
                .map_or(s.len(), |e| i + e);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let end = text[i + 2..].find("*/").map_or(s.len(), |e| i + 2 + e + 2);
            blank(&mut out, i, end);
            i = end;
        } else if (rest.starts_with(b"r\"") || rest.starts_with(b"r#"))
            && (i == 0 || !ident(s[i - 1]))
        {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let from = i + 2 + hashes;
            let end = text[from..]
                .find(&close)
                .map_or(s.len(), |e| from + e + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if s[i] == b'"' {
            let mut j = i + 1;
            while j < s.len() && s[j] != b'"' {
                j += if s[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if s[i] == b'\'' && (rest.get(1) == Some(&b'\\') || rest.get(2) == Some(&b'\'')) {
            // A character literal (a lifetime has no closing quote two bytes on).
            let from = if rest[1] == b'\\' { i + 3 } else { i + 2 };
            let end = s[from..]
                .iter()
                .position(|&c| c == b'\'')
                .map_or(s.len(), |e| from + e + 1);
            blank(&mut out, i, end);
            i = end;
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

/// A reader of use trees: `a::b::{c, d::{self, e}, *}`.
struct Tree<'a> {
    s: &'a [u8],
    i: usize,
}

impl Tree<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }
    fn sep(&mut self) -> bool {
        self.ws();
        if self.s[self.i..].starts_with(b"::") {
            self.i += 2;
            self.ws();
            true
        } else {
            false
        }
    }
    fn ident(&mut self) -> Option<String> {
        if self.s.get(self.i) == Some(&b'*') {
            self.i += 1;
            return Some("*".into());
        }
        let start = self.i;
        while self
            .s
            .get(self.i)
            .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_')
        {
            self.i += 1;
        }
        (self.i > start).then(|| String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }
    /// Every path the tree after `prefix` names.
    fn paths(&mut self, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        self.ws();
        if self.s.get(self.i) == Some(&b'{') {
            self.i += 1;
            loop {
                self.ws();
                if self.s.get(self.i).is_none_or(|&c| c == b'}') {
                    self.i += 1;
                    return;
                }
                let before = self.i;
                self.paths(prefix.clone(), out);
                // Skip `as alias` and anything else up to the next item.
                while self.s.get(self.i).is_some_and(|&c| c != b',' && c != b'}') {
                    self.i += 1;
                }
                if self.s.get(self.i) == Some(&b',') {
                    self.i += 1;
                }
                if self.i == before {
                    return;
                }
            }
        }
        let Some(id) = self.ident() else {
            out.push(prefix);
            return;
        };
        let mut p = prefix;
        if id != "self" || p.is_empty() {
            p.push(id);
        }
        if self.sep() {
            self.paths(p, out);
        } else {
            out.push(p);
        }
    }
}

/// Every path in `code` that starts with `crate::`, `super::` or `self::`, with its line number
/// (a use tree gives one path per leaf).
fn module_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let s = code.as_bytes();
    let mut out = vec![];
    for kw in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(kw) {
            let before = i.checked_sub(1).map(|j| s[j]);
            if before
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c == b':')
            {
                continue; // `$crate::` in macros, `a::self::`, or an identifier ending in `crate`
            }
            let line = code[..i].matches('\n').count() + 1;
            let mut t = Tree {
                s,
                i: i + kw.len() - 2,
            };
            t.sep();
            let mut paths = vec![];
            t.paths(vec![kw.trim_end_matches("::").to_string()], &mut paths);
            out.extend(paths.into_iter().map(|p| (line, p)));
        }
    }
    out.sort();
    out
}

/// Every `crate::<name>` in `text` outside comments and strings, with its line number.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    module_paths(&code_of(text))
        .into_iter()
        .filter(|(_, p)| p[0] == "crate" && p.len() > 1)
        .map(|(line, p)| (line, p[1].clone()))
        .collect()
}

/// `path` (from a file of module `here`) as a path from the crate root.
fn resolve(here: &[String], path: &[String]) -> Vec<String> {
    let mut out = here.to_vec();
    let mut rest = path;
    if path[0] == "crate" {
        out.clear();
        rest = &path[1..];
    }
    while let Some(first) = rest.first() {
        match first.as_str() {
            "super" => drop(out.pop()),
            "self" => {}
            _ => break,
        }
        rest = &rest[1..];
    }
    out.extend(rest.iter().cloned());
    out
}

/// The line from which a file's code is its unit tests (`#[cfg(test)]` then `mod tests`).
fn tests_from(code: &str) -> usize {
    let lines: Vec<&str> = code.lines().collect();
    (1..lines.len())
        .find(|&n| lines[n - 1].trim() == "#[cfg(test)]" && lines[n].starts_with("mod tests"))
        .map_or(usize::MAX, |n| n + 1)
}

/// The library's sources: module path → (file, code).
fn library() -> Vec<(Vec<String>, PathBuf, String)> {
    let src = src_dir();
    let mut files = vec![];
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|f| {
            let m = module_path(&src, &f)?;
            let code = code_of(&std::fs::read_to_string(&f).unwrap());
            Some((m, f, code))
        })
        .collect()
}

/// A folder's files by name (a subfolder by its name), without `mod` and unit tests.
fn children(lib: &[(Vec<String>, PathBuf, String)], folder: &[String]) -> Vec<String> {
    let mut out: Vec<String> = lib
        .iter()
        .filter(|(m, ..)| m.len() > folder.len() && m.starts_with(folder))
        .map(|(m, ..)| m[folder.len()].clone())
        .filter(|c| c != "tests")
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The names a folder's `mod.rs` imports from its files (`use x::Name;`, `pub use x::{..};`, the
/// public items of `x` for `use x::*;`), and those of the folder above for `use super::*;`: name
/// → the path of the file it comes from.
fn imported_names(
    lib: &[(Vec<String>, PathBuf, String)],
    folder: &[String],
) -> HashMap<String, Vec<String>> {
    let mut names = HashMap::new();
    let Some((_, _, code)) = lib
        .iter()
        .find(|(m, f, _)| m == folder && f.ends_with("mod.rs"))
    else {
        return names;
    };
    let kids = children(lib, folder);
    let code = &code[..code
        .lines()
        .take(tests_from(code).saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum::<usize>()
        .min(code.len())];
    for (i, _) in code.match_indices("use ") {
        if i > 0 && !matches!(code.as_bytes()[i - 1], b' ' | b'\n' | b')') {
            continue;
        }
        let mut t = Tree {
            s: code.as_bytes(),
            i: i + 4,
        };
        let mut paths = vec![];
        t.paths(vec![], &mut paths);
        for p in paths {
            if p.len() == 2 && p[0] == "super" && p[1] == "*" && folder.len() > 1 {
                for (n, target) in imported_names(lib, &folder[..folder.len() - 1]) {
                    names.entry(n).or_insert(target);
                }
                continue;
            }
            if p.len() < 2 || !kids.contains(&p[0]) {
                continue;
            }
            let mut target = folder.to_vec();
            target.push(p[0].clone());
            if p[1] == "*" {
                let file = lib.iter().find(|(m, ..)| *m == target);
                for n in file.map(|(_, _, c)| public_items(c)).unwrap_or_default() {
                    names.entry(n).or_insert(target.clone());
                }
            } else {
                names.insert(p.last().unwrap().clone(), target);
            }
        }
    }
    names
}

/// The items a file declares `pub`, `pub(crate)` or `pub(super)`.
fn public_items(code: &str) -> Vec<String> {
    let mut out = vec![];
    for line in code.lines() {
        let Some(rest) = line.trim_start().strip_prefix("pub") else {
            continue;
        };
        let rest = match rest.strip_prefix('(') {
            Some(r) => r.split_once(')').map_or("", |(_, r)| r),
            None => rest,
        };
        let mut words = rest.split_whitespace().skip_while(|w| *w == "unsafe");
        if let (
            Some("fn" | "struct" | "enum" | "trait" | "const" | "static" | "type" | "mod"),
            Some(name),
        ) = (words.next(), words.next())
        {
            let name: String = name
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

/// Identifiers of `code` named by `names` that are not a field, method or path tail (`.x`,
/// `::x`), with their line numbers: what a `use super::*` brings in.
fn glob_uses<'a>(
    code: &str,
    names: &'a HashMap<String, Vec<String>>,
) -> Vec<(usize, &'a Vec<String>)> {
    let s = code.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    for (n, line) in code.lines().enumerate() {
        let b = line.as_bytes();
        let mut j = 0;
        while j < b.len() {
            if b[j].is_ascii_alphabetic() || b[j] == b'_' {
                let start = j;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                    j += 1;
                }
                let prev = code[..i + start].trim_end().as_bytes().last().copied();
                let path_tail = prev == Some(b'.')
                    || (prev == Some(b':') && s[..i + start].trim_ascii_end().ends_with(b"::"));
                if !path_tail && let Some(t) = names.get(&line[start..j]) {
                    out.push((n + 1, t));
                }
            } else {
                j += 1;
            }
        }
        i += line.len() + 1;
    }
    out
}

#[test]
fn library_modules_depend_one_way() {
    let lib = library();
    let rank = |m: &str| ORDER.iter().position(|x| *x == m);
    let mut backwards = vec![];
    let mut checked = 0;
    for (here, f, code) in &lib {
        let module = &here[0];
        if ANYWHERE.contains(&module.as_str()) {
            continue;
        }
        let own = rank(module).unwrap_or_else(|| {
            panic!(
                "{}: module `{module}` is not in ORDER (tests/layers.rs, ARCHITECTURE.md)",
                f.display()
            )
        });
        let tests = tests_from(code);
        for (line, path) in module_paths(code) {
            let here = if line >= tests {
                [here.clone(), vec!["tests".into()]].concat()
            } else {
                here.clone()
            };
            let used = &resolve(&here, &path)[0];
            checked += 1;
            if ANYWHERE.contains(&used.as_str()) || used == "*" {
                continue;
            }
            match rank(used) {
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

/// The uses inside folders that point backwards (or name a file outside [`FOLDERS`]), and how
/// many uses between files of one folder were checked.
fn folder_uses_backwards(lib: &[(Vec<String>, PathBuf, String)]) -> (Vec<String>, usize) {
    let order = |folder: &[String]| {
        let key = folder.join("/");
        FOLDERS.iter().find(|(k, _)| *k == key).map(|(_, o)| *o)
    };
    let mut bad = vec![];
    let mut checked = 0;
    // Every folder with files has an order that lists exactly its files.
    let mut folders: Vec<Vec<String>> = lib
        .iter()
        .filter(|(_, f, _)| f.ends_with("mod.rs"))
        .map(|(m, ..)| m.clone())
        .collect();
    folders.sort();
    for folder in &folders {
        let kids = children(lib, folder);
        let key = folder.join("/");
        match order(folder) {
            None if kids.is_empty() => {}
            None => bad.push(format!(
                "src/{key}/ has no order in FOLDERS (tests/layers.rs)"
            )),
            Some(o) => {
                let mut listed: Vec<String> = o.iter().map(|s| s.to_string()).collect();
                listed.sort();
                if listed != kids {
                    bad.push(format!(
                        "FOLDERS lists {listed:?} for src/{key}/, which holds {kids:?}"
                    ));
                }
            }
        }
    }
    for (path, f, code) in lib {
        let tests = tests_from(code);
        let glob = code
            .lines()
            .take(tests.saturating_sub(1))
            .any(|l| l.trim() == "use super::*;");
        let folder = &path[..path.len() - 1];
        let names = if glob {
            imported_names(lib, folder)
        } else {
            HashMap::new()
        };
        let uses = module_paths(code)
            .into_iter()
            .map(|(line, p)| {
                let here = if line >= tests {
                    [path.clone(), vec!["tests".into()]].concat()
                } else {
                    path.clone()
                };
                (line, resolve(&here, &p), here)
            })
            .chain(
                glob_uses(code, &names)
                    .into_iter()
                    .filter(|(line, _)| *line < tests)
                    .map(|(line, t)| (line, t.clone(), path.clone())),
            );
        'uses: for (line, mut target, here) in uses {
            // A name a folder's mod.rs imports stands for the file it comes from.
            let k = loop {
                let k = here.iter().zip(&target).take_while(|(a, b)| a == b).count();
                if k == 0 || k >= here.len() || k >= target.len() {
                    continue 'uses; // another module, its own parts or its folder
                }
                if children(lib, &target[..k]).contains(&target[k]) {
                    break k;
                }
                match imported_names(lib, &target[..k]).get(&target[k]) {
                    Some(t) if t != &target[..t.len().min(target.len())] => target = t.clone(),
                    _ => continue 'uses, // an item of the folder's mod.rs
                }
            };
            if here[k..].iter().any(|p| p == "tests") {
                continue; // unit tests
            }
            let folder = &here[..k];
            let (mine, theirs) = (&here[k], target[k].clone());
            if &theirs == mine {
                continue;
            }
            checked += 1;
            let Some(o) = order(folder) else { continue };
            let (Some(a), Some(b)) = (
                o.iter().position(|x| x == mine),
                o.iter().position(|x| *x == theirs),
            ) else {
                continue; // reported above
            };
            if b > a {
                bad.push(format!(
                    "{}:{line}: `{}` uses `{theirs}`, which is above it in src/{}/",
                    f.display(),
                    here[..=k].join("::"),
                    folder.join("/")
                ));
            }
        }
    }
    bad.sort();
    bad.dedup();
    (bad, checked)
}

#[test]
fn files_inside_each_folder_depend_one_way() {
    let lib = library();
    let (bad, checked) = folder_uses_backwards(&lib);
    assert!(
        checked > 50,
        "found only {checked} uses between the files of a folder"
    );
    assert!(
        bad.is_empty(),
        "uses inside a folder that point backwards:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_check_sees_a_backwards_use() {
    // The scanner itself: a path in code counts, one in a comment, a string or `$crate::` does not.
    let text = "use crate::store::Snapshot; // crate::sql\nlet x = $crate::output::emit;\nlet s = \"crate::sql\";";
    assert_eq!(crate_paths(text), vec![(1, "store".to_string())]);
}

#[test]
fn the_check_sees_a_backwards_use_inside_a_folder() {
    // `store/ipc.rs` (the bottom of `store/`) naming `segment`, directly, through a use tree, and
    // through a name `store/mod.rs` re-exports; a unit test may.
    let lib = library();
    let ipc = lib.iter().find(|(m, ..)| m == &["store", "ipc"]).unwrap();
    let code = "use super::segment::Segment;\nuse crate::store::{manifest, episode::{self, EpisodeTable}};\nfn f(_: crate::store::Segment) {}\n#[cfg(test)]\nmod tests {\n    use crate::store::Dataset;\n}\n";
    let mut lib = lib
        .iter()
        .filter(|(m, ..)| m != &ipc.0)
        .cloned()
        .collect::<Vec<_>>();
    lib.push((ipc.0.clone(), ipc.1.clone(), code.to_string()));
    let (bad, _) = folder_uses_backwards(&lib);
    let f = ipc.1.display();
    assert_eq!(
        bad,
        vec![
            format!("{f}:1: `store::ipc` uses `segment`, which is above it in src/store/"),
            format!("{f}:2: `store::ipc` uses `episode`, which is above it in src/store/"),
            format!("{f}:2: `store::ipc` uses `manifest`, which is above it in src/store/"),
            format!("{f}:3: `store::ipc` uses `segment`, which is above it in src/store/"),
        ]
    );
    // The code as it is has none.
    assert_eq!(folder_uses_backwards(&library()).0, Vec::<String>::new());
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
