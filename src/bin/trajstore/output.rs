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

pub(crate) use trajstore::units::{human_duration, parse_duration, parse_size};

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
