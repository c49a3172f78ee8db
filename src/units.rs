//! Sizes and durations as users write them (`256MiB`, `10m`), for every surface that takes one
//! (the CLI's flags, `TRAJSTORE_SQL_MEMORY`, Python's size strings): checked or saturated, never
//! wrapped.

/// Parses `0`, `30s`, `10m`, `2h`, `7d` (a bare number is seconds).
pub fn parse_duration(s: &str) -> std::result::Result<std::time::Duration, String> {
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
pub fn human_duration(d: std::time::Duration) -> String {
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
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
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
        "t" | "tb" => 1e12,
        "tib" => 1024f64.powi(4),
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use B, KiB, MiB, GiB, TiB)"
            ));
        }
    };
    let v = num * mult;
    if v.is_nan() || v < 1.0 {
        return Err(format!("`{s}`: a size must be at least 1 byte"));
    }
    // `as` saturates: a size beyond u64 is "all of it", never a wrapped small one.
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_saturate_or_fail_never_wrap() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1.5G"), Ok(1_500_000_000));
        assert_eq!(parse_size("99999999999999999999TiB"), Ok(u64::MAX));
        assert!(parse_size("0").is_err() && parse_size("lots").is_err());
        assert!(parse_size("NaN").is_err());
        let never = parse_duration("18446744073709552s").unwrap();
        assert_eq!(never.as_secs(), 18_446_744_073_709_552);
        assert!(parse_duration("1e400s").is_err() && parse_duration("-1s").is_err());
        assert_eq!(human_duration(std::time::Duration::from_secs(600)), "10m");
        assert_eq!(human_duration(std::time::Duration::ZERO), "0s");
        assert_eq!(
            human_duration(std::time::Duration::from_millis(1500)),
            "1500ms"
        );
    }
}
