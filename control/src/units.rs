//! The spellings of sizes and durations that people write, in flags and the config
//! file alike, and how sizes are shown back: one parser each, for every crate.
//!
//! Sizes: a byte count or a number with K, M, G, T, P or E, optionally followed by
//! `B` or `iB`, all powers of 1024 (`4096`, `512K`, `500G`, `1.5GiB`, `1 t`);
//! fractions are computed exactly, never through floating point. Durations: a
//! number and a unit without spaces (`45s`, `90m`, `12h`, `30d`, `2w`, `1h30m`), or
//! `0`, in whole seconds.

use parse_size::Config;

/// The size units, all binary: the cache is measured the way `df -h` measures it.
const SIZES: Config = Config::new().with_binary();

/// Examples of the accepted forms, for error messages.
const SIZE_EXAMPLES: &str = "examples: 4096, 512K, 64M, 1.5GiB, 500G";
const DURATION_EXAMPLES: &str = "examples: 45s, 90m, 12h, 30d, 2w";

/// Parses a size into bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    match SIZES.parse_size(trimmed) {
        Ok(_) if is_fractional_byte_count(trimmed) => {
            Err(format!("'{text}': a byte count must be whole"))
        }
        Ok(bytes) => Ok(bytes),
        Err(parse_size::Error::PosOverflow) => Err(format!("'{text}' is out of range")),
        Err(_) => Err(match unknown_suffix(trimmed) {
            Some(suffix) => format!(
                "'{text}': unknown size suffix '{suffix}' (use K, M, G or T, optionally followed by B or iB)"
            ),
            None => format!("'{text}' is not a size ({SIZE_EXAMPLES})"),
        }),
    }
}

/// `1.5` would be rounded to a byte count nobody wrote; with a unit, a fraction
/// names whole bytes often enough (`1.5G`) and is rounded to the nearest byte.
fn is_fractional_byte_count(text: &str) -> bool {
    text.contains('.')
        && text
            .trim_end_matches(['b', 'B'])
            .trim_end()
            .ends_with(|c: char| c.is_ascii_digit())
}

/// The letters after a number, when the parser does not know them as a unit.
fn unknown_suffix(text: &str) -> Option<&str> {
    let start = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, suffix) = (text[..start].trim(), text[start..].trim());
    let known = SIZES.parse_size(format!("1{suffix}")).is_ok();
    (!known && SIZES.parse_size(number).is_ok()).then_some(suffix)
}

/// The duration units, exactly those the help text names, in seconds.
const DURATION_UNITS: [(&str, u64); 5] = [
    ("s", 1),
    ("m", 60),
    ("h", 3600),
    ("d", 86_400),
    ("w", 604_800),
];

/// Parses a duration into whole seconds: `0`, or numbers each followed by a unit of
/// `DURATION_UNITS` (`45s`, `1h30m`, `1.5h`), adding up to whole seconds. Nothing
/// else is accepted, so a message can list all that works.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let bad = |why: String| {
        format!(
            "'{text}' is not a duration: {why} (a number and s, m, h, d or w, without spaces: {})",
            DURATION_EXAMPLES.trim_start_matches("examples: ")
        )
    };
    let trimmed = text.trim();
    // One token, as in flags: "3 days" reads as two arguments would in a shell.
    if trimmed.contains(char::is_whitespace) {
        return Err(bad("write it without spaces".into()));
    }
    if trimmed == "0" {
        return Ok(0);
    }
    if trimmed.is_empty() {
        return Err(bad("it is empty".into()));
    }
    let mut rest = trimmed;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        if number.is_empty() {
            return Err(bad(format!("'{unit}' has no number before it")));
        }
        if unit.is_empty() {
            return Err(bad(format!("'{number}' has no unit after it")));
        }
        let Some(&(_, scale)) = DURATION_UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(bad(format!("unknown unit '{unit}'")));
        };
        let secs = scaled(number, scale).map_err(|why| bad(why.into()))?;
        total = total
            .checked_add(secs)
            .ok_or_else(|| bad("it is out of range".into()))?;
        rest = next;
    }
    Ok(total)
}

/// `number` (digits, at most one `.`) times `scale` seconds, exactly.
fn scaled(number: &str, scale: u64) -> Result<u64, &'static str> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > 9 {
        return Err("it is not a number and a unit");
    }
    let range = "it is out of range";
    let whole: u64 = whole.parse().map_err(|_| range)?;
    let mut secs = whole.checked_mul(scale).ok_or(range)?;
    if !fraction.is_empty() {
        let denominator = 10u64.pow(u32::try_from(fraction.len()).map_err(|_| range)?);
        let part = fraction
            .parse::<u64>()
            .map_err(|_| range)?
            .checked_mul(scale)
            .ok_or(range)?;
        if part % denominator != 0 {
            return Err("it must come to whole seconds");
        }
        secs = secs.checked_add(part / denominator).ok_or(range)?;
    }
    Ok(secs)
}

/// A duration as `parse_duration` reads it back (`30s`, `2m`, `1h30m`).
pub fn format_duration(duration: std::time::Duration) -> String {
    let mut left = duration.as_secs();
    if left == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (name, scale) in DURATION_UNITS.iter().rev() {
        if left >= *scale {
            out.push_str(&format!("{}{name}", left / scale));
            left %= scale;
        }
    }
    out
}

/// A byte count for people, in binary units as sizes are written (`12 B`, `1.5 GiB`);
/// `parse_size` reads it back.
pub fn format_bytes(bytes: u64) -> String {
    bytesize::ByteSize(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn parsers_never_panic(text in ".{0,24}") {
            let _ = parse_size(&text);
            let _ = parse_duration(&text);
        }

        #[test]
        fn whole_sizes_round_trip(n in 0u64..1_000_000, unit in 0usize..5) {
            let suffix = ["", "K", "M", "G", "T"][unit];
            prop_assert_eq!(parse_size(&format!("{n}{suffix}")), Ok(n << (10 * unit as u32)));
        }

        #[test]
        fn durations_round_trip(n in 0u64..1_000_000, unit in 0usize..5) {
            let (suffix, scale) = [("s", 1), ("m", 60), ("h", 3600), ("d", 86_400), ("w", 604_800)][unit];
            prop_assert_eq!(parse_duration(&format!("{n}{suffix}")), Ok(n * scale));
        }

        #[test]
        fn formatted_sizes_read_back_within_the_shown_precision(bytes in 0u64..(1 << 50)) {
            let back = parse_size(&format_bytes(bytes)).map_err(TestCaseError::fail)?;
            // One decimal of the unit shown: within 5% of that unit, below 1024 exact.
            prop_assert!(back.abs_diff(bytes) <= bytes / 20, "{bytes} -> {} -> {back}", format_bytes(bytes));
        }
    }

    #[test]
    fn parses_the_spellings_users_write() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("500G"), Ok(500 << 30));
        assert_eq!(parse_size("200G"), Ok(200 << 30));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64MB"), Ok(64 << 20));
        assert_eq!(parse_size("1 g"), Ok(1 << 30));
        assert_eq!(parse_size("2KIB"), Ok(2 << 10));
    }

    #[test]
    fn fractions_are_exact() {
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1.5T"), Ok(3 << 39));
        // 0.1 has no exact binary fraction: f64 arithmetic would be off by one here.
        assert_eq!(parse_size("0.1E"), Ok(115_292_150_460_684_698));
        assert_eq!(parse_size("1.5 KiB"), Ok(1536));
    }

    #[test]
    fn bad_sizes_get_one_clear_line() {
        for bad in [
            "",
            "M",
            "12X",
            "-1",
            "1.5",
            "1.5B",
            "1.5 b",
            "9999999999T",
            "five",
            "1K2",
        ] {
            let e = parse_size(bad).expect_err(bad);
            assert!(e.starts_with(&format!("'{bad}'")), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        assert!(parse_size("20X").is_err_and(|e| e.contains("unknown size suffix 'X'")));
        assert!(parse_size("1.5").is_err_and(|e| e.contains("must be whole")));
        assert!(parse_size("9999999999T").is_err_and(|e| e.contains("out of range")));
        assert!(parse_size("five").is_err_and(|e| e.contains("is not a size (examples")));
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("0"), Ok(0));
        assert_eq!(parse_duration("30s"), Ok(30));
        assert_eq!(parse_duration("45s"), Ok(45));
        assert_eq!(parse_duration("2m"), Ok(120));
        assert_eq!(parse_duration("90m"), Ok(5400));
        assert_eq!(parse_duration("1h30m"), Ok(5400));
        assert_eq!(parse_duration("1.5h"), Ok(5400));
        assert_eq!(parse_duration("30d"), Ok(30 * 86_400));
        assert_eq!(parse_duration("2w"), Ok(2 * 604_800));
        assert_eq!(parse_duration("1d12h"), Ok(129_600));
        assert_eq!(parse_duration("0.5m"), Ok(30));
    }

    #[test]
    fn bad_durations_get_one_clear_line() {
        for bad in [
            "",
            "d",
            "10",
            "-3d",
            "3 days",
            "500ms",
            "10x",
            "99999999999999999999w",
        ] {
            let e = parse_duration(bad).expect_err(bad);
            assert!(e.starts_with(&format!("'{bad}' is not a duration")), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        assert!(parse_duration("3 days").is_err_and(|e| e.contains("without spaces")));
        // Only the units the help names; the message lists them and nothing else.
        for (bad, why) in [
            ("500ms", "unknown unit 'ms'"),
            ("1month", "unknown unit 'month'"),
            ("5x", "unknown unit 'x'"),
            ("2sec", "unknown unit 'sec'"),
            ("0.5s", "whole seconds"),
        ] {
            let e = parse_duration(bad).expect_err(bad);
            assert!(e.contains(why), "{e}");
            assert!(
                e.ends_with(
                    "(a number and s, m, h, d or w, without spaces: 45s, 90m, 12h, 30d, 2w)"
                ),
                "{e}"
            );
            for unlisted in ["ms", "µs", "min", "months", "years"] {
                assert!(!e.contains(&format!(" {unlisted},")), "{e}");
            }
        }
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(12), "12 B");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(1 << 20), "1.0 MiB");
        assert_eq!(format_duration(std::time::Duration::from_secs(30)), "30s");
        assert_eq!(
            format_duration(std::time::Duration::from_secs(30 * 86_400)),
            "4w2d"
        );
        assert_eq!(
            parse_duration(&format_duration(std::time::Duration::from_secs(5400))),
            Ok(5400)
        );
    }
}
