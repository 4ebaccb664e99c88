//! Time values in swanctl.conf syntax: an unsigned integer followed by an optional unit, `s`
//! (seconds, the default), `m` (minutes), `h` (hours) or `d` (days), e.g. `30s`, `5m`, `4h`, `2d`;
//! also `ms` and `us` (not in swanctl) for the data plane's short timers.

use std::time::Duration;

/// Parses a swanctl-style time value. `"0"` is valid (it disables the timer it configures).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "invalid time {text:?}: expected a whole number with an optional unit us, ms, s, m, h or d (e.g. \"30s\", \"4h\")"
        ));
    }
    // Multipliers in microseconds; swanctl's units (s, m, h, d) plus ms and us for the data
    // plane's short timers.
    let multiplier: u64 = match unit.trim() {
        "us" => 1,
        "ms" => 1_000,
        "" | "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        other => {
            return Err(format!(
                "invalid time {text:?}: unknown unit {other:?} (use us, ms, s, m, h or d)"
            ));
        }
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("invalid time {text:?}: number too large"))?;
    value
        .checked_mul(multiplier)
        .map(Duration::from_micros)
        .ok_or_else(|| format!("invalid time {text:?}: number too large"))
}

/// Formats a duration back into the shortest exact swanctl unit (`4h`, `90s`).
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_nanos() != 0 {
        let us = d.as_micros();
        return if us.is_multiple_of(1_000) {
            format!("{}ms", us / 1_000)
        } else {
            format!("{us}us")
        };
    }
    if s == 0 {
        "0s".to_owned()
    } else if s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if s.is_multiple_of(3_600) {
        format!("{}h", s / 3_600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("4h"), Ok(Duration::from_secs(14_400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("50us"), Ok(Duration::from_micros(50)));
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_micros(50)), "50us");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(parse_duration(" 0 "), Ok(Duration::ZERO));
        assert_eq!(parse_duration("10 m"), Ok(Duration::from_secs(600)));
    }

    #[test]
    fn rejects() {
        for bad in [
            "",
            "s",
            "-5s",
            "5x",
            "1.5h",
            "4hours",
            "99999999999999999999d",
            "213503982334602d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn round_trip() {
        for s in ["0s", "45s", "5m", "4h", "2d", "90s"] {
            assert_eq!(format_duration(parse_duration(s).unwrap()), s);
        }
    }
}
