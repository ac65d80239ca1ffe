//! What a scenario's flags must be, checked before anything runs: each
//! scenario's `check` calls these on its own values, and a bad one is a
//! `BenchError::Input` naming the flag (`hover bench` exits 2 with it).

use crate::BenchError;

/// Every value of the list flag `flag` passes `check`; the first that
/// does not is the error.
pub fn each(
    flag: &str,
    values: &[String],
    check: impl Fn(&str) -> Result<(), String>,
) -> Result<(), BenchError> {
    for v in values {
        check(v).map_err(|e| BenchError::Input(format!("{flag}: {e}")))?;
    }
    Ok(())
}

/// A size (`256M`, `1G`): its bytes.
pub fn size(s: &str) -> Result<u64, String> {
    hover_abi::workload::parse_size(s.trim()).ok_or_else(|| {
        format!("'{s}' is not a size: use a number with an optional K, M, G or T suffix (e.g. 256M, 1G)")
    })
}

/// Every value of `flag` is a size.
pub fn sizes(flag: &str, values: &[String]) -> Result<(), BenchError> {
    each(flag, values, |v| size(v).map(drop))
}

/// Every value of `flag` is a guest memory size `hover run --memory`
/// takes: whole 4 KiB pages, within what Hover maps.
pub fn memories(flag: &str, values: &[String]) -> Result<(), BenchError> {
    each(flag, values, |m| {
        let bytes = size(m)?;
        let max = hover_vmm::config::machine::MAX_MEMORY;
        if bytes == 0 || bytes % 4096 != 0 {
            return Err(format!(
                "{m} is not a whole number of 4 KiB pages (e.g. 256M)"
            ));
        }
        if bytes > max {
            return Err(format!(
                "{m} is more than the {} a guest may have",
                hover_vmm::config::size_text(max)
            ));
        }
        Ok(())
    })
}

/// `runs` is at least 1.
pub fn runs(runs: u32) -> Result<(), BenchError> {
    match runs {
        0 => Err(BenchError::Input("--runs: give at least 1".into())),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_bad_value_is_named_with_its_flag() {
        assert!(memories("--memories", &v(&["256M", "1G"])).is_ok());
        for (bad, says) in [
            ("256", "whole number of 4 KiB pages"),
            ("0", "whole number of 4 KiB pages"),
            ("lots", "not a size"),
            ("100T", "more than"),
        ] {
            let e = memories("--memories", &v(&["256M", bad]))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("--memories: ") && e.contains(says), "{e}");
        }
        assert!(sizes("--wss", &v(&["16M", "12K"])).is_ok());
        assert!(sizes("--wss", &v(&["x"]))
            .unwrap_err()
            .to_string()
            .starts_with("--wss: "));
        assert!(runs(0).is_err() && runs(1).is_ok());
    }
}
