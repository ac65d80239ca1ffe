//! The guest command line: whitespace-separated `key=value` tokens, e.g.
//! `workload=hello`. Parsed the same way by the monitor (to refuse bad input
//! before the VM starts) and by the guest.

/// A malformed token or value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmdlineError<'a> {
    /// A token without `=`, or with an empty key.
    NotKeyValue(&'a str),
    /// The same key given twice.
    Duplicate(&'a str),
    /// A value that should be a number is not.
    NotANumber {
        /// The key.
        key: &'a str,
        /// The offending value.
        value: &'a str,
    },
}

/// The `key=value` pairs of `cmdline`, in order.
pub fn pairs(cmdline: &str) -> impl Iterator<Item = Result<(&str, &str), CmdlineError<'_>>> {
    cmdline
        .split_ascii_whitespace()
        .map(|tok| match tok.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k, v)),
            _ => Err(CmdlineError::NotKeyValue(tok)),
        })
}

/// Every token is `key=value` and no key repeats.
pub fn check_syntax(cmdline: &str) -> Result<(), CmdlineError<'_>> {
    for (i, p) in pairs(cmdline).enumerate() {
        let (k, _) = p?;
        if pairs(cmdline)
            .take(i)
            .any(|q| matches!(q, Ok((k2, _)) if k2 == k))
        {
            return Err(CmdlineError::Duplicate(k));
        }
    }
    Ok(())
}

/// The value of `key`, if present (the first one; see [`check_syntax`]).
pub fn get<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    pairs(cmdline)
        .filter_map(Result::ok)
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// The value of `key` as an unsigned integer (decimal or `0x` hex), or `default`.
pub fn get_u64<'a>(cmdline: &'a str, key: &'a str, default: u64) -> Result<u64, CmdlineError<'a>> {
    match get(cmdline, key) {
        None => Ok(default),
        Some(v) => parse_u64(v).ok_or(CmdlineError::NotANumber { key, value: v }),
    }
}

/// Parse a decimal or `0x`-prefixed hexadecimal unsigned integer.
pub fn parse_u64(v: &str) -> Option<u64> {
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_and_lookup() {
        let c = "workload=hello  seconds=3";
        assert_eq!(get(c, "workload"), Some("hello"));
        assert_eq!(get_u64(c, "seconds", 1), Ok(3));
        assert_eq!(get_u64(c, "missing", 7), Ok(7));
        assert!(check_syntax(c).is_ok());
        assert!(check_syntax("").is_ok());
    }

    #[test]
    fn malformed_tokens() {
        assert_eq!(
            check_syntax("workload"),
            Err(CmdlineError::NotKeyValue("workload"))
        );
        assert_eq!(check_syntax("=x"), Err(CmdlineError::NotKeyValue("=x")));
        assert_eq!(check_syntax("a=1 a=2"), Err(CmdlineError::Duplicate("a")));
        assert_eq!(
            get_u64("seconds=ten", "seconds", 1),
            Err(CmdlineError::NotANumber {
                key: "seconds",
                value: "ten"
            })
        );
        assert_eq!(parse_u64("0x10"), Some(16));
    }
}
