//! Go duration syntax for `wait=` (`10s`, `500ms`, `1m30s`, `1.5s`, `0`).
//!
//! Like Go's `time.ParseDuration`: an optional sign, then one or more
//! decimal numbers each with a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`);
//! a bare number is only valid as `0`. Negative durations clamp to zero.

use std::time::Duration;

/// Parses a Go duration; `Err` carries a message for the 400.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let orig = s;
    let bad = || format!("time: invalid duration {orig:?}");
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total_ns: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
        if num_len == 0 {
            return Err(bad());
        }
        let num = &rest[..num_len];
        if num == "." || num.matches('.').count() > 1 {
            return Err(bad());
        }
        let value: f64 = num.parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(rest.len(), |(i, _)| i);
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("time: missing unit in duration {orig:?}")),
            other => return Err(format!("time: unknown unit {other:?} in duration {orig:?}")),
        };
        total_ns += value * scale;
        if total_ns > 9.2e18 {
            return Err(bad());
        }
    }
    if neg {
        return Ok(Duration::ZERO);
    }
    Ok(Duration::from_nanos(total_ns.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_go_duration("10s"), Ok(ms(10_000)));
        assert_eq!(parse_go_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_go_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_go_duration("1.5s"), Ok(ms(1_500)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_go_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_go_duration("2h"), Ok(ms(7_200_000)));
        assert_eq!(parse_go_duration("-1s"), Ok(Duration::ZERO), "negative clamps to zero");
    }

    #[test]
    fn refuses_what_go_refuses() {
        for bad in ["", "10", "s", "1x", "1.2.3s", ".s", "-", "1s2", "99999999999999h"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
    }
}
