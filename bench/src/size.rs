//! Sizes on the command line: `4096`, `512K`, `32M`, `1G` (powers of 1024), the same
//! spelling `stagefs` and `run.sh` use.

/// Parses a whole number of bytes with an optional K, M, G or T suffix.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KIB" => 10,
        "M" | "MIB" => 20,
        "G" | "GIB" => 30,
        "T" | "TIB" => 40,
        _ => {
            return Err(format!(
                "'{text}' is not a size (examples: 4096, 512K, 32M)"
            ));
        }
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (examples: 4096, 512K, 32M)"))?;
    let bytes = value
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("'{text}' is too large"))?;
    if bytes == 0 {
        return Err("a size must be at least 1 byte".into());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("32M"), Ok(32 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("12X").is_err());
    }
}
