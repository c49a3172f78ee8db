//! What the commands print: stdout that survives a closed pipe, progress bars, sizes, errors.

/// `println!` through [`emit`].
macro_rules! outln {
    ($($t:tt)*) => { $crate::output::emit(&format!("{}\n", format_args!($($t)*))) };
}

use indicatif::{ProgressBar, ProgressStyle};

/// Writes to stdout; a closed pipe (`trajstore info d | head`) ends the program quietly.
pub(crate) fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

pub(crate) fn progress(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{human_pos}}/{{human_len}} ({{per_sec}}, eta {{eta}})"
        ))
        .expect("valid template"),
    );
    pb
}

/// Parses `123`, `64KiB`, `256MiB`, `1GiB`, `1.5G`, `10MB`.
pub(crate) fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 256MiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use B, KiB, MiB, GiB)"
            ));
        }
    };
    let v = num * mult;
    if v < 1.0 {
        return Err("size must be at least 1 byte".into());
    }
    Ok(v as u64)
}

/// A library error as one line (DataFusion messages may span several).
pub(crate) fn one_line(e: trajstore::Error) -> anyhow::Error {
    anyhow::anyhow!(
        e.to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    )
}
