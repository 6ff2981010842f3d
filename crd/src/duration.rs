//! Durations written the way Go's `time.ParseDuration` reads them (`15s`, `1m30s`, `500ms`,
//! `1.5h`): the controller's leader-election flags take the same values as
//! kube-controller-manager's, and a `NodeIPAMPool`'s `scaleDown.emptyFor` what the CRD's CEL
//! `duration()` accepts (minus negative durations, which both refuse).

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("negative durations are not allowed")]
    Negative,
    #[error("missing unit in {0:?} (use ns, us, ms, s, m or h, e.g. 15s or 1m30s)")]
    MissingUnit(String),
    #[error("unknown unit {unit:?} in {input:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit { unit: String, input: String },
    #[error("invalid duration {0:?} (e.g. 15s, 1m30s, 500ms)")]
    Invalid(String),
    #[error("duration {0:?} is too long")]
    Overflow(String),
}

/// Nanoseconds per unit, longest unit names first so that `ms` is not read as `m`.
const UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a Go duration. A bare `0` is zero, as in Go; any other number needs a unit.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if s.starts_with('-') {
        return Err(DurationError::Negative);
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (number, after) =
            split_number(rest).ok_or_else(|| DurationError::Invalid(input.into()))?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let unit = &after[..unit_len];
        if unit.is_empty() {
            return Err(DurationError::MissingUnit(input.into()));
        }
        let per = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, per)| *per)
            .ok_or_else(|| DurationError::UnknownUnit {
                unit: unit.into(),
                input: input.into(),
            })?;
        total = total
            .checked_add(
                number
                    .nanos(per)
                    .ok_or_else(|| DurationError::Overflow(input.into()))?,
            )
            .ok_or_else(|| DurationError::Overflow(input.into()))?;
        rest = &after[unit_len..];
    }
    let secs =
        u64::try_from(total / 1_000_000_000).map_err(|_| DurationError::Overflow(input.into()))?;
    // The remainder is below 10^9, so it fits.
    let nanos = u32::try_from(total % 1_000_000_000).unwrap_or(0);
    Ok(Duration::new(secs, nanos))
}

/// A decimal number: whole part and fraction digits.
struct Number<'a> {
    whole: &'a str,
    fraction: &'a str,
}

impl Number<'_> {
    /// The number times `per` nanoseconds; fraction digits below a nanosecond are dropped.
    fn nanos(&self, per: u128) -> Option<u128> {
        let whole: u128 = if self.whole.is_empty() {
            0
        } else {
            self.whole.parse().ok()?
        };
        let mut value = whole.checked_mul(per)?;
        let mut scale = per;
        for digit in self.fraction.chars() {
            scale /= 10;
            if scale == 0 {
                break;
            }
            value = value.checked_add(u128::from(digit.to_digit(10)?) * scale)?;
        }
        Some(value)
    }
}

/// Splits a leading `123`, `1.5` or `.5` off `s`.
fn split_number(s: &str) -> Option<(Number<'_>, &str)> {
    let whole_len = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let whole = &s[..whole_len];
    let after = &s[whole_len..];
    let (fraction, after) = match after.strip_prefix('.') {
        Some(f) => {
            let len = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
            (&f[..len], &f[len..])
        }
        None => ("", after),
    };
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    Some((Number { whole, fraction }, after))
}

/// Formats like Go's `Duration.String` for whole milliseconds and above (`1m30s`, `500ms`),
/// so help texts and messages show values the parser takes back.
pub fn format(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, rem) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rem) = (rem / 60_000, rem % 60_000);
    let (s, frac) = (rem / 1000, rem % 1000);
    let mut out = String::new();
    if h > 0 {
        out += &format!("{h}h");
    }
    if h > 0 || m > 0 {
        out += &format!("{m}m");
    }
    if frac == 0 {
        out += &format!("{s}s");
    } else {
        let f = format!("{frac:03}");
        out += &format!("{s}.{}s", f.trim_end_matches('0'));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_examples() {
        let ok = [
            ("15s", Duration::from_secs(15)),
            ("1m", Duration::from_secs(60)),
            ("1m30s", Duration::from_secs(90)),
            ("500ms", Duration::from_millis(500)),
            ("1.5h", Duration::from_secs(5400)),
            ("2h45m", Duration::from_secs(9900)),
            (".5s", Duration::from_millis(500)),
            ("1.s", Duration::from_secs(1)),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("+5s", Duration::from_secs(5)),
            ("1h1m1s1ms", Duration::new(3661, 1_000_000)),
        ];
        for (input, want) in ok {
            assert_eq!(parse(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn bad_input_says_why() {
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert_eq!(parse("-1s"), Err(DurationError::Negative));
        assert_eq!(parse("15"), Err(DurationError::MissingUnit("15".into())));
        assert!(matches!(
            parse("15x"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse("1d"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert!(matches!(parse("s"), Err(DurationError::Invalid(_))));
        assert!(matches!(parse("."), Err(DurationError::Invalid(_))));
        assert!(matches!(
            parse("99999999999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
        let e = parse("15").expect_err("no unit").to_string();
        assert!(e.contains("15s"), "{e}");
    }

    #[test]
    fn format_round_trips() {
        for d in [
            Duration::from_secs(15),
            Duration::from_secs(90),
            Duration::from_millis(500),
            Duration::from_millis(1500),
            Duration::from_secs(3600),
            Duration::from_secs(3661),
        ] {
            assert_eq!(parse(&format(d)), Ok(d), "{}", format(d));
        }
        assert_eq!(format(Duration::from_secs(90)), "1m30s");
        assert_eq!(format(Duration::from_secs(3600)), "1h0m0s");
    }
}
