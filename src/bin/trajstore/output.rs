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

/// The library's progress reports drawn as a bar on stderr, only when stderr is a terminal (so
/// that logs and pipes get no control characters).
pub(crate) struct TerminalBar(ProgressBar);

impl TerminalBar {
    /// A bar when stderr is a terminal and `show` is set; `None` otherwise.
    pub(crate) fn on_terminal(show: bool) -> Option<Self> {
        use std::io::IsTerminal;
        (show && std::io::stderr().is_terminal()).then(|| Self(ProgressBar::hidden()))
    }
}

impl trajstore::Progress for TerminalBar {
    fn start(&self, what: &str, unit: trajstore::progress::Unit, total: Option<u64>) {
        use trajstore::progress::Unit;
        let (pos, rate) = match unit {
            Unit::Bytes => ("{bytes}/{total_bytes}", "{binary_bytes_per_sec}"),
            _ => ("{human_pos}/{human_len} rows", "{per_sec}"),
        };
        let template = match total {
            Some(n) => {
                self.0.set_length(n);
                format!("{what} {{spinner}} [{{wide_bar}}] {pos}, {rate}, ETA {{eta}}")
            }
            None => {
                let pos = pos.split('/').next().unwrap_or(pos);
                let unit = if unit == Unit::Bytes { "" } else { " rows" };
                format!("{what} {{spinner}} {{elapsed_precise}} {pos}{unit}, {rate}")
            }
        };
        if let Ok(style) = ProgressStyle::with_template(&template) {
            self.0.set_style(style.progress_chars("=> "));
        }
        self.0.reset();
        self.0
            .set_draw_target(indicatif::ProgressDrawTarget::stderr());
    }

    fn advance(&self, n: u64) {
        self.0.inc(n);
    }

    fn finish(&self, ok: bool) {
        if ok {
            self.0.finish_and_clear();
        } else {
            self.0.abandon();
        }
    }
}

/// Parses `0`, `30s`, `10m`, `2h`, `7d` (a bare number is seconds).
pub(crate) fn parse_duration(s: &str) -> std::result::Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 0s, 30s, 10m, 2h, 7d)"))?;
    let secs = match unit {
        "" | "s" => 1.0,
        "ms" => 0.001,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        other => return Err(format!("unknown unit `{other}`: use ms, s, m, h or d")),
    };
    if !(n.is_finite() && n >= 0.0) {
        return Err(format!("`{s}` must be a non-negative duration"));
    }
    std::time::Duration::try_from_secs_f64(n * secs).map_err(|e| format!("`{s}`: {e}"))
}

/// A duration as a user writes one: `0s`, `90s`, `10m`, `2h`, `7d`.
pub(crate) fn human_duration(d: std::time::Duration) -> String {
    let s = d.as_secs();
    if d.is_zero() {
        return "0s".into();
    }
    if d.subsec_nanos() != 0 || s == 0 {
        return format!("{}ms", d.as_millis());
    }
    for (unit, n) in [("d", 86400), ("h", 3600), ("m", 60)] {
        if s.is_multiple_of(n) {
            return format!("{}{unit}", s / n);
        }
    }
    format!("{s}s")
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

/// An error and its causes on one line, `outer: inner: ...`, each said once: a cause whose text
/// the message before it already ends with is skipped (the library's I/O, Arrow and Parquet
/// errors quote their source), and an object store's raw error stops the chain (the library's
/// [`trajstore::Error::Remote`] message already says what the store said, without its XML).
pub(crate) fn report(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !parts.last().is_some_and(|prev| prev.ends_with(&text)) {
            parts.push(text);
        }
        if let Some(trajstore::Error::Remote { .. }) = cause.downcast_ref::<trajstore::Error>() {
            break;
        }
    }
    parts.join(": ")
}
