//! Durations as people write them (`"30s"`, `"10m"`, `"1h 30m"`), with
//! errors worded for them rather than for a parser.

use std::time::Duration;

/// The longest duration a config or a command line may give: ten years,
/// beyond any use. humantime reads up to 584 billion years; past 292
/// billion, adding one to the clock (a tunnel's idle deadline, a harvest's
/// retry) panics, and past 292 million its milliseconds no longer fit an
/// `i64`, the store's unit of time. A ceiling far below both keeps every
/// sum and product of them safe.
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 86_400);

/// Parses a duration longer than zero and at most [`MAX_DURATION`]; the
/// error says what to write.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    const LIKE: &str = "like \"30s\", \"500ms\", \"10m\" or \"1h 30m\"";
    let text = s.trim();
    match humantime::parse_duration(text) {
        Ok(d) if d > MAX_DURATION => Err(too_long(s)),
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be longer than zero".into()),
        Err(humantime::DurationError::Empty) => Err(format!("is empty: write a duration {LIKE}")),
        Err(humantime::DurationError::UnknownUnit { unit, value, .. }) if unit.is_empty() => {
            Err(format!(
                "{s:?} has no unit: write \"{value}s\" for seconds, \"{value}m\" for minutes, \
                 or another duration {LIKE}"
            ))
        }
        Err(humantime::DurationError::UnknownUnit { unit, .. }) => Err(format!(
            "{s:?} has an unknown unit {unit:?}: use ms, s, m, h or d, {LIKE}"
        )),
        Err(humantime::DurationError::NumberOverflow) => Err(too_long(s)),
        Err(_) => Err(format!("expected a duration {LIKE}, found {s:?}")),
    }
}

fn too_long(s: &str) -> String {
    format!("{s:?} is too long: at most \"3650d\" (ten years)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_their_errors_read_plainly() {
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration(" 500ms "), Ok(Duration::from_millis(500)));
        assert_eq!(
            parse_duration("0s").unwrap_err(),
            "must be longer than zero"
        );
        assert_eq!(
            parse_duration("30").unwrap_err(),
            "\"30\" has no unit: write \"30s\" for seconds, \"30m\" for minutes, or another \
             duration like \"30s\", \"500ms\", \"10m\" or \"1h 30m\""
        );
        assert_eq!(
            parse_duration("5 minuts").unwrap_err(),
            "\"5 minuts\" has an unknown unit \"minuts\": use ms, s, m, h or d, like \"30s\", \
             \"500ms\", \"10m\" or \"1h 30m\""
        );
        for bad in ["soon", "-3s", "m5", "3s!"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(!e.contains(" at "), "{bad}: {e}");
            assert!(e.contains("like \"30s\""), "{bad}: {e}");
        }
        assert!(parse_duration("").unwrap_err().starts_with("is empty"));
    }

    #[test]
    fn durations_past_ten_years_are_refused_by_name() {
        assert_eq!(parse_duration("3650d"), Ok(MAX_DURATION));
        assert_eq!(
            parse_duration("3649d 23h 59m 59s 999ms 1000us"),
            Ok(MAX_DURATION)
        );
        // The last is past what humantime can count at all: the same words.
        for long in [
            "3650d 1ns",
            "3651d",
            "11y",
            "300000000000y",
            "600000000000y",
        ] {
            assert_eq!(
                parse_duration(long).unwrap_err(),
                format!("{long:?} is too long: at most \"3650d\" (ten years)")
            );
        }
    }
}
