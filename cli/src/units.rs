//! Human sizes: `4096`, `512K`, `64M`, `200G`, `1.5T` (binary multiples), and back.

/// Parses a path inside the source (`model_dirs`): relative, without `..`.
pub(crate) fn parse_source_dir(text: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::Path::new(text.trim_end_matches('/'));
    let plain = path
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    // "/" trims to nothing: the root, which is searched anyway, and not relative.
    if plain && !path.as_os_str().is_empty() {
        Ok(path.to_path_buf())
    } else {
        Err(format!(
            "'{text}' must be a directory inside the source, relative to it (e.g. teams/nlp/hf/hub)"
        ))
    }
}

/// Parses a size; suffixes K, M, G, T (optionally followed by `B` or `iB`) are powers of 1024.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => {
            return Err(format!(
                "'{text}': unknown size suffix '{other}' (use K, M, G or T)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (examples: 4096, 512K, 64M, 1.5T)"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("'{text}' is out of range"));
    }
    if shift == 0 && number.contains('.') {
        return Err(format!("'{text}': a byte count must be whole"));
    }
    Ok(bytes.round() as u64)
}

/// Parses a duration: a whole number with `s`, `m`, `h`, `d` or `w` (`90m`, `30d`).
pub(crate) fn parse_duration(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let bad = || format!("'{text}' is not a duration (examples: 45s, 90m, 12h, 30d, 2w)");
    let unit = t.chars().last().ok_or_else(bad)?;
    let scale = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        'w' => 604_800,
        _ => return Err(bad()),
    };
    let number: u64 = t[..t.len() - 1].parse().map_err(|_| bad())?;
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("'{text}' is out of range"))
}

/// Formats a byte count for people: `1.5 GiB`.
pub(crate) fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
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
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("200G"), Ok(200 << 30));
        assert_eq!(parse_size("1.5T"), Ok(3 << 39));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1 g"), Ok(1 << 30));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "M", "12X", "-1", "1.5", "1e3", "9999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn source_dirs_are_relative_and_inside() {
        assert_eq!(
            parse_source_dir("teams/hf/hub/"),
            Ok(std::path::PathBuf::from("teams/hf/hub"))
        );
        for bad in ["", "/", "/abs/hub", "../up", "a/../../b", "./a"] {
            assert!(parse_source_dir(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("45s"), Ok(45));
        assert_eq!(parse_duration("90m"), Ok(5400));
        assert_eq!(parse_duration("30d"), Ok(30 * 86_400));
        for bad in ["", "d", "10", "1.5h", "-3d", "10y", "99999999999999999999w"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(12), "12 B");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
    }
}
