//! Kubernetes quantities as byte counts (pure), for flags that take bytes (kvd's).

/// The bytes a quantity like `64Gi`, `500M`, `1.5Ti` or `1048576` stands for; `None`
/// for what is not a byte quantity (`100m`, `1e3x`, negative values).
pub fn bytes(quantity: &str) -> Option<u64> {
    let q = quantity.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let factor: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return None,
    };
    if let Ok(n) = number.parse::<u64>() {
        return n.checked_mul(factor);
    }
    let f: f64 = number
        .parse()
        .ok()
        .filter(|f: &f64| f.is_finite() && *f >= 0.0)?;
    let total = f * factor as f64;
    (total < u64::MAX as f64).then(|| total.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn binary_and_decimal_suffixes() {
        assert_eq!(bytes("64Gi"), Some(64 << 30));
        assert_eq!(bytes("1Ti"), Some(1 << 40));
        assert_eq!(bytes("500M"), Some(500_000_000));
        assert_eq!(bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(bytes("1048576"), Some(1 << 20));
        assert_eq!(bytes("100m"), None, "milli-bytes are not bytes");
        assert_eq!(bytes("lots"), None);
        assert_eq!(bytes("20Ei"), None, "overflow");
    }
}
