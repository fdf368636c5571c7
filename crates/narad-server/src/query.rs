//! Query strings walked from the raw string, as Narad does: `+` and
//! percent escapes decoded, every occurrence seen (so duplicates can be
//! refused), unknown parameters ignored.

/// Decodes one query component (`+` is a space, `%XX` a byte).
pub fn decode_component(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
                    (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                    _ => {
                        let end = (i + 3).min(b.len());
                        return Err(format!(
                            "invalid URL escape {:?}",
                            String::from_utf8_lossy(&b[i..end])
                        ));
                    }
                }
                i += 3;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Every `(name, raw value)` pair of a raw query string, in order.
/// `name` is decoded; the value is left raw for the caller to decode.
pub fn pairs(raw: &str) -> Vec<(String, &str)> {
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let name = decode_component(k)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_else(|_| k.to_owned());
            (name, v)
        })
        .collect()
}

/// The raw values of `name`, in order.
pub fn values<'a>(pairs: &[(String, &'a str)], name: &str) -> Vec<&'a str> {
    pairs.iter().filter(|(k, _)| k == name).map(|(_, v)| *v).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_plus_and_percent_escapes() {
        assert_eq!(decode_component("a+b%2Fc%00").unwrap(), b"a b/c\0");
        assert!(decode_component("%4").is_err());
        assert!(decode_component("%zz").is_err());
    }

    #[test]
    fn walks_every_occurrence_in_order() {
        let p = pairs("key=a&partition=1&key=b&flag&=x");
        assert_eq!(values(&p, "key"), vec!["a", "b"]);
        assert_eq!(values(&p, "flag"), vec![""]);
        assert_eq!(values(&p, "missing"), Vec::<&str>::new());
    }
}
