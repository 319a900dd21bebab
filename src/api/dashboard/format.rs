//! Figures for people: 1,234; 2.3 s; 5 min ago; 42%. A few lines each, so
//! written here rather than pulled in as crates (sizes use `bytesize`).

/// `n` with thousands separated by commas: `1,234,567`.
pub fn count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A duration of `ms` milliseconds: `850 ms`, `2.3 s`, `42 s`, `5 min`,
/// `3 h 12 min`, `2 d 4 h`.
pub fn duration_ms(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..10_000 => format!("{:.1} s", ms as f64 / 1000.0),
        10_000..60_000 => format!("{} s", ms / 1000),
        60_000..3_600_000 => format!("{} min", ms / 60_000),
        3_600_000..86_400_000 => {
            let (h, m) = (ms / 3_600_000, ms % 3_600_000 / 60_000);
            if m == 0 {
                format!("{h} h")
            } else {
                format!("{h} h {m} min")
            }
        }
        _ => {
            let (d, h) = (ms / 86_400_000, ms % 86_400_000 / 3_600_000);
            if h == 0 {
                format!("{d} d")
            } else {
                format!("{d} d {h} h")
            }
        }
    }
}

/// How long before `now` `then` was (unix ms): `just now`, `12 s ago`,
/// `5 min ago`; a time ahead is `in 5 min`.
pub fn ago(then: i64, now: i64) -> String {
    let past = now - then;
    if past.abs() < 2_000 {
        return "just now".into();
    }
    let coarse = |ms: i64| {
        // Whole units: "1 h 12 min ago" reads as too precise for a glance.
        match ms {
            0..60_000 => format!("{} s", ms / 1000),
            60_000..3_600_000 => format!("{} min", ms / 60_000),
            3_600_000..86_400_000 => format!("{} h", ms / 3_600_000),
            _ => format!("{} d", ms / 86_400_000),
        }
    };
    if past > 0 {
        format!("{} ago", coarse(past))
    } else {
        format!("in {}", coarse(-past))
    }
}

/// `part` of `whole` as a whole percentage (`–` when `whole` is 0).
pub fn percent(part: i64, whole: i64) -> String {
    if whole <= 0 {
        return "–".into();
    }
    format!("{}%", (part as f64 * 100.0 / whole as f64).round() as i64)
}

/// A size in bytes: `1.2 MiB`.
pub fn bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec().to_string()
}

/// The figure of a formatted count: what the page shows, read back.
#[cfg(test)]
fn uncount(text: &str) -> i64 {
    text.replace(',', "").parse().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_with_separators() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_234), "1,234");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(-12_345), "-12,345");
        assert_eq!(uncount(&count(987_654_321)), 987_654_321);
    }

    #[test]
    fn durations_read_in_their_unit() {
        assert_eq!(duration_ms(850), "850 ms");
        assert_eq!(duration_ms(2_345), "2.3 s");
        assert_eq!(duration_ms(42_000), "42 s");
        assert_eq!(duration_ms(5 * 60_000 + 10_000), "5 min");
        assert_eq!(duration_ms(3 * 3_600_000 + 12 * 60_000), "3 h 12 min");
        assert_eq!(duration_ms(2 * 86_400_000 + 4 * 3_600_000), "2 d 4 h");
    }

    #[test]
    fn times_read_as_ago() {
        assert_eq!(ago(1_000, 1_500), "just now");
        assert_eq!(ago(0, 12_000), "12 s ago");
        assert_eq!(ago(0, 5 * 60_000 + 30_000), "5 min ago");
        assert_eq!(ago(0, 3 * 3_600_000), "3 h ago");
        assert_eq!(ago(10 * 60_000, 0), "in 10 min");
    }

    #[test]
    fn shares_and_sizes() {
        assert_eq!(percent(1, 3), "33%");
        assert_eq!(percent(0, 0), "–");
        assert_eq!(bytes(1536), "1.5 KiB");
    }
}
