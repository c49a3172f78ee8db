//! `trajstore sql` (feature `sql`): one query to a table or a file, or an interactive prompt with
//! line editing and history.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::open::*;
use crate::output::*;

#[derive(Args)]
pub(crate) struct SqlArgs {
    /// Dataset directory, or a URL (s3://BUCKET/PREFIX; see `trajstore pull --help`).
    dataset: PathBuf,
    /// The query; without one, an interactive prompt (`.tables`, `.schema [TABLE]`, `.quit`;
    /// statements end with `;`).
    query: Option<String>,
    /// Query this version instead of the newest.
    #[arg(long)]
    version: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = SqlFormat::Table)]
    format: SqlFormat,
    /// Write the result to this file instead of stdout (not inside a dataset directory).
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The most memory the query may use (e.g. 4GiB): sorts and aggregations spill to a
    /// temporary directory beyond it, other queries fail with a message. Default: the
    /// TRAJSTORE_SQL_MEMORY environment variable, else half of the machine's memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory_limit: Option<u64>,
    /// Print the physical plan instead of running the query.
    #[arg(long)]
    explain: bool,
    /// Print each query's time to stderr, split into running the query (plan, execute, collect
    /// the result in memory) and writing the result (`.timer on|off` in the prompt).
    #[arg(long)]
    timer: bool,
    /// Run the query this many times (with --timer, one time line per run; the result is written
    /// once). For timing a query without the process start and dataset open.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Also run SQL that reads or writes files outside the dataset or changes the session:
    /// `COPY ... TO` (writes any path you can write), `CREATE EXTERNAL TABLE ... LOCATION` (reads
    /// any file you can read), `CREATE TABLE [AS]`, `CREATE VIEW`, `INSERT`, `DROP`, `SET`.
    /// Without it SQL is read-only: only queries (SELECT, WITH, EXPLAIN, SHOW, DESCRIBE) run.
    #[arg(long)]
    allow_writes: bool,
    /// For a URL: pull the transition files into the local mirror on the first scan of
    /// `transitions` and query the mirror (memory-mapped), instead of reading only the
    /// projected columns of the segment objects with ranged GETs (the default).
    #[arg(long)]
    pull: bool,
    /// Run the query on the Ballista cluster whose scheduler is at df://HOST:PORT (started with
    /// `trajstore cluster scheduler`). DATASET must be a URL (or a path every process of the
    /// cluster reads); only its catalog is read here.
    #[cfg(feature = "ballista")]
    #[arg(long, value_name = "df://HOST:PORT")]
    cluster: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SqlFormat {
    /// An aligned table.
    Table,
    /// CSV with a header (lists are written as `[a, b, ...]`).
    Csv,
    /// JSON lines, one object per row.
    Json,
    /// Parquet (zstd).
    Parquet,
    /// Arrow IPC file.
    Arrow,
}

pub(crate) fn run(mut a: SqlArgs) -> Result<()> {
    if a.memory_limit.is_some() {
        trajstore::sql::set_memory_limit(a.memory_limit);
    }
    if let Some(out) = &a.output {
        trajstore::store::dataset::check_output_path("--output", out).map_err(one_line)?;
    }
    #[cfg(feature = "ballista")]
    if a.cluster.is_some() {
        let session = cluster_session(&a)?.allow_writes(a.allow_writes);
        return match a.query.clone() {
            Some(q) => run_sql(&session, &q, &a),
            None => sql_shell(&session, &mut a),
        };
    }
    let remote = match a.dataset.to_str().filter(|s| trajstore::format::is_url(s)) {
        Some(url) => Some(remote_session(url, a.version, a.pull)?),
        None => None,
    };
    let (session, fetched) = match remote {
        Some(r) => r,
        None => (
            trajstore::sql::SqlSession::try_new(&open_snapshot(&a.dataset, a.version)?)?,
            None,
        ),
    };
    let session = session.allow_writes(a.allow_writes);
    let before = fetched.as_ref().map(|f| f());
    let r = match a.query.clone() {
        Some(q) => run_sql(&session, &q, &a),
        None => sql_shell(&session, &mut a),
    };
    if let (Some(f), Some((requests, bytes)), true) = (fetched, before, a.timer) {
        let (r2, b2) = f();
        eprintln!(
            "fetched: {} bytes in {} ranged reads of segment objects",
            b2 - bytes,
            r2 - requests
        );
    }
    r
}

/// What a remote table reports it has downloaded: (requests, bytes).
type FetchedFn = Box<dyn Fn() -> (u64, u64)>;

/// A session whose queries run on a Ballista cluster.
#[cfg(feature = "ballista")]
fn cluster_session(a: &SqlArgs) -> Result<trajstore::sql::SqlSession> {
    let cluster = a.cluster.as_deref().unwrap_or_default();
    let dataset = a
        .dataset
        .to_str()
        .context("the dataset's name is not UTF-8")?;
    Ok(trajstore::sql::SqlSession::cluster(
        cluster, dataset, a.version,
    )?)
}

/// A session over a URL: `episodes` from the catalog (only the episode tables are fetched);
/// `transitions` reads the projected columns of the segment objects with ranged GETs, or with
/// `pull`, the transition files are pulled when a query first scans `transitions`.
#[cfg(feature = "remote")]
fn remote_session(
    url: &str,
    version: Option<u64>,
    pull: bool,
) -> Result<(trajstore::sql::SqlSession, Option<FetchedFn>)> {
    let (catalog, _) = open_catalog(std::path::Path::new(url), version)?;
    if !pull {
        let remote = trajstore::remote::Remote::open(url, reader_remote_options())
            .with_context(|| format!("cannot open dataset {url}"))?;
        let table = std::sync::Arc::new(trajstore::sql::RemoteTransitions::new(&remote, &catalog)?);
        let session = trajstore::sql::SqlSession::with_transitions(&catalog, table.clone())?;
        // The remote's runtime holds the store's pooled connections: keep it for the session.
        let remote = std::sync::Arc::new(remote);
        let fetched: FetchedFn = Box::new(move || {
            let _ = &remote;
            let f = table.fetched();
            (f.requests, f.bytes)
        });
        return Ok((session, Some(fetched)));
    }
    let (url, version) = (url.to_string(), catalog.version());
    let open = move || {
        let (snap, fetched) = trajstore::DatasetBuilder::from_uri(&url)
            .with_version(version)
            .with_remote_options(reader_remote_options())
            .load_reported()?;
        if let Some(r) = fetched {
            report_fetch("pulled version", &r);
        }
        Ok(snap)
    };
    Ok((trajstore::sql::SqlSession::deferred(&catalog, open)?, None))
}

#[cfg(not(feature = "remote"))]
fn remote_session(
    url: &str,
    version: Option<u64>,
    _pull: bool,
) -> Result<(trajstore::sql::SqlSession, Option<FetchedFn>)> {
    Ok((
        trajstore::sql::SqlSession::try_new(&open_snapshot(std::path::Path::new(url), version)?)?,
        None,
    ))
}

fn run_sql(session: &trajstore::sql::SqlSession, q: &str, a: &SqlArgs) -> Result<()> {
    if a.explain {
        emit(&session.explain(q, false).map_err(one_line)?);
        return Ok(());
    }
    let mut result = None;
    let mut query_times = vec![];
    for _ in 0..a.repeat {
        let t = std::time::Instant::now();
        result = Some(session.query(q).map_err(one_line)?);
        query_times.push(t.elapsed());
    }
    let result = result.expect("repeat >= 1");
    let t = std::time::Instant::now();
    write_query_result(&result, a)?;
    if a.timer {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        for (i, d) in query_times.iter().enumerate() {
            let output = if i + 1 == query_times.len() {
                format!("{:.3} ms", ms(t.elapsed()))
            } else {
                "-".into()
            };
            eprintln!(
                "run time: query {:.3} ms, output {output}, {} rows",
                ms(*d),
                result.num_rows()
            );
        }
    }
    Ok(())
}

fn write_query_result(result: &trajstore::sql::QueryResult, a: &SqlArgs) -> Result<()> {
    match &a.output {
        Some(path) => {
            let tmp = path.with_extension("tmp");
            let file = std::fs::File::create(&tmp)
                .with_context(|| format!("cannot create {}", tmp.display()))?;
            write_result(result, a.format, std::io::BufWriter::new(file))?;
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot write {}", path.display()))?;
            if a.format == SqlFormat::Table || std::io::IsTerminal::is_terminal(&std::io::stdout())
            {
                eprintln!("{} rows written to {}", result.num_rows(), path.display());
            }
        }
        None => {
            let mut buf = vec![];
            write_result(result, a.format, &mut buf)?;
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(&buf).and_then(|()| out.flush())
                && e.kind() != std::io::ErrorKind::BrokenPipe
            {
                bail!("cannot write to stdout: {e}");
            }
        }
    }
    Ok(())
}

fn write_result<W: std::io::Write + Send>(
    r: &trajstore::sql::QueryResult,
    format: SqlFormat,
    mut w: W,
) -> Result<()> {
    use arrow::array::{ArrayRef, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    match format {
        SqlFormat::Table => {
            let text = arrow::util::pretty::pretty_format_batches_with_schema(
                r.schema.clone(),
                &r.batches,
            )?;
            writeln!(w, "{text}")?;
            let n = r.num_rows();
            writeln!(w, "{n} row{}", if n == 1 { "" } else { "s" })?;
        }
        SqlFormat::Csv => {
            // CSV has no nested types: lists become their display text.
            let flat = |t: &DataType| t.is_nested();
            let schema = std::sync::Arc::new(Schema::new(
                r.schema
                    .fields()
                    .iter()
                    .map(|f| {
                        if flat(f.data_type()) {
                            Field::new(f.name(), DataType::Utf8, true)
                        } else {
                            f.as_ref().clone()
                        }
                    })
                    .collect::<Vec<_>>(),
            ));
            let mut cw = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut w);
            if r.batches.is_empty() {
                cw.write(&RecordBatch::new_empty(schema.clone()))?;
            }
            let opts = FormatOptions::default().with_null("");
            for b in &r.batches {
                let cols = b
                    .columns()
                    .iter()
                    .map(|c| -> Result<ArrayRef> {
                        if !flat(c.data_type()) {
                            return Ok(c.clone());
                        }
                        let f = ArrayFormatter::try_new(c.as_ref(), &opts)?;
                        Ok(std::sync::Arc::new(StringArray::from_iter(
                            (0..c.len()).map(|i| c.is_valid(i).then(|| f.value(i).to_string())),
                        )))
                    })
                    .collect::<Result<Vec<_>>>()?;
                cw.write(&RecordBatch::try_new(schema.clone(), cols)?)?;
            }
        }
        SqlFormat::Json => {
            let mut jw = arrow::json::LineDelimitedWriter::new(&mut w);
            for b in &r.batches {
                jw.write(b)?;
            }
            jw.finish()?;
        }
        SqlFormat::Parquet => {
            let props = parquet::file::properties::WriterProperties::builder()
                .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
                .build();
            let mut pw = parquet::arrow::ArrowWriter::try_new(w, r.schema.clone(), Some(props))?;
            for b in &r.batches {
                pw.write(b)?;
            }
            pw.close()?;
            return Ok(());
        }
        SqlFormat::Arrow => {
            let mut fw = arrow::ipc::writer::FileWriter::try_new(&mut w, &r.schema)?;
            for b in &r.batches {
                fw.write(b)?;
            }
            fw.finish()?;
        }
    }
    w.flush()?;
    Ok(())
}

/// Where the interactive prompt keeps its history: `$TRAJSTORE_HISTORY`, else
/// `$XDG_STATE_HOME/trajstore/sql_history`, else `~/.local/state/trajstore/sql_history`.
fn history_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TRAJSTORE_HISTORY") {
        return Some(PathBuf::from(p));
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(state.join("trajstore").join("sql_history"))
}

/// The lines of the shell: a line editor with history on a terminal, plain lines otherwise.
enum ShellInput {
    Editor(Box<rustyline::DefaultEditor>, Option<PathBuf>),
    Pipe(std::io::Lines<std::io::StdinLock<'static>>),
}

impl ShellInput {
    fn new() -> Self {
        use std::io::{BufRead, IsTerminal};
        if std::io::stdin().is_terminal()
            && let Ok(mut ed) = rustyline::DefaultEditor::new()
        {
            let path = history_path();
            if let Some(p) = &path {
                let _ = ed.load_history(p);
            }
            return ShellInput::Editor(Box::new(ed), path);
        }
        ShellInput::Pipe(std::io::stdin().lock().lines())
    }

    fn interactive(&self) -> bool {
        matches!(self, ShellInput::Editor(..))
    }

    /// The next line, or `None` at the end of input (Ctrl-D). Ctrl-C abandons the statement
    /// being typed (returned as an empty marker `Some(None)`).
    fn next(&mut self, prompt: &str) -> Result<Option<Option<String>>> {
        match self {
            ShellInput::Pipe(lines) => match lines.next() {
                None => Ok(None),
                Some(l) => Ok(Some(Some(l.context("cannot read stdin")?))),
            },
            ShellInput::Editor(ed, _) => match ed.readline(prompt) {
                Ok(l) => Ok(Some(Some(l))),
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Some(None)),
                Err(rustyline::error::ReadlineError::Eof) => Ok(None),
                Err(e) => Err(anyhow::anyhow!("cannot read the terminal: {e}")),
            },
        }
    }

    /// Records a whole statement or dot command in the history (and its file).
    fn remember(&mut self, entry: &str) {
        if let ShellInput::Editor(ed, path) = self {
            let _ = ed.add_history_entry(entry.trim());
            if let Some(p) = path {
                if let Some(dir) = p.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let _ = ed.save_history(p);
            }
        }
    }
}

fn sql_shell(session: &trajstore::sql::SqlSession, a: &mut SqlArgs) -> Result<()> {
    let mut input = ShellInput::new();
    let interactive = input.interactive();
    if interactive {
        eprintln!(
            "trajstore sql: tables {}; statements end with `;`; .tables, .schema [TABLE], .help, .quit; history in {}",
            session.table_names().join(", "),
            history_path().map_or_else(|| "memory only".into(), |p| p.display().to_string())
        );
    }
    let mut pending = String::new();
    let mut failed = false;
    loop {
        let prompt = if pending.is_empty() {
            "trajstore> "
        } else {
            "   ...> "
        };
        let line = match input.next(prompt)? {
            None => break,
            Some(None) => {
                pending.clear();
                continue;
            }
            Some(Some(l)) => l,
        };
        let t = line.trim();
        if pending.is_empty() && t.starts_with('.') {
            input.remember(t);
            let mut words = t.split_whitespace();
            match (words.next().unwrap_or(""), words.next()) {
                (".quit" | ".exit", _) => return Ok(()),
                (".tables", _) => outln!("{}", session.table_names().join("\n")),
                (".schema", table) => {
                    let names = match table {
                        Some(t) => vec![t.trim_end_matches(';').to_string()],
                        None => session.table_names(),
                    };
                    for n in names {
                        match session.table_schema(&n) {
                            Ok(s) => {
                                outln!("{n}(");
                                for f in s.fields() {
                                    outln!(
                                        "  {} {}{}",
                                        f.name(),
                                        f.data_type(),
                                        if f.is_nullable() { "" } else { " NOT NULL" }
                                    );
                                }
                                outln!(")");
                            }
                            Err(e) => {
                                eprintln!("error: {}", one_line(e));
                                failed = true;
                            }
                        }
                    }
                }
                (".timer", Some(on @ ("on" | "off"))) => a.timer = on == "on",
                (".timer", _) => {
                    eprintln!("error: usage: .timer on|off");
                    failed = true;
                }
                (".help", _) => outln!(
                    ".tables  .schema [TABLE]  .timer on|off  .quit   (SQL statements end with `;`; \
                     EXPLAIN works; read-only unless started with --allow-writes; Ctrl-C abandons \
                     a statement, Ctrl-D quits)"
                ),
                (other, _) => {
                    eprintln!("error: unknown command {other} (try .help)");
                    failed = true;
                }
            }
            continue;
        }
        if !t.is_empty() {
            pending.push_str(&line);
            pending.push('\n');
        }
        if t.ends_with(';') {
            let q = std::mem::take(&mut pending);
            input.remember(&q);
            if let Err(e) = run_sql(session, q.trim().trim_end_matches(';'), a) {
                eprintln!("error: {e:#}");
                failed = true;
            }
        }
    }
    if !pending.trim().is_empty() {
        input.remember(&pending);
        if let Err(e) = run_sql(session, pending.trim().trim_end_matches(';'), a) {
            eprintln!("error: {e:#}");
            failed = true;
        }
    }
    if interactive {
        eprintln!();
    }
    if failed && !interactive {
        bail!("some statements failed");
    }
    Ok(())
}
