//! Human sizes: parsing `64MiB`, `2G`, `512k` and printing byte counts.

/// Parses a byte size: a number with an optional unit (`k`/`KiB` = 1024, `M`/`MiB`, `G`/`GiB`; `KB`, `MB`, `GB`
/// are decimal).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{s:?} is not a size (e.g. 64MiB)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        u => return Err(format!("unknown size unit {u:?} in {s:?}")),
    };
    let v = n * mult;
    if !(1.0..1e18).contains(&v) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v as u64)
}

/// `1.23 GiB`-style rendering.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
        assert_eq!(human(1536), "1.50 KiB");
    }
}
