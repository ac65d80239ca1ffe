//! What a scenario's flags must be, checked before anything runs: each
//! scenario's `check` calls these on its own values, and a bad one is a
//! `BenchError::Input` naming the flag (`hover bench` exits 2 with it).

use std::path::Path;

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
        if bytes == 0 {
            return Err(format!("{m}: a guest needs some memory (e.g. 256M)"));
        }
        if bytes % 4096 != 0 {
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

/// The guest parameter `key=value` the scenario will pass to `workload`
/// is one the built-in guest takes (its range, its syntax): checked with
/// the guest's own table, the error naming `flag`.
pub fn guest_param(flag: &str, workload: &str, key: &str, value: &str) -> Result<(), BenchError> {
    hover_vmm::config::check_builtin_cmdline(&format!("workload={workload} {key}={value}"))
        .map_err(|e| BenchError::Input(format!("{flag}: {e}")))
}

/// What the built-in guest keeps for itself: a working set must leave
/// this much of the guest's memory free.
pub const GUEST_OWN: u64 = 16 << 20;

/// Every working set of `ws_flag` fits in every memory of `mem_flag`
/// with [`GUEST_OWN`] to spare (both already checked as sizes), and is
/// not empty: a guest that cannot place it would end at once, and the
/// scenario would fail without saying why.
pub fn fits(
    (ws_flag, sets): (&str, &[String]),
    (mem_flag, memories): (&str, &[String]),
) -> Result<(), BenchError> {
    for set in sets {
        let ws = size(set).map_err(|e| BenchError::Input(format!("{ws_flag}: {e}")))?;
        if ws == 0 {
            return Err(BenchError::Input(format!(
                "{ws_flag}: a working set of 0 bytes gives the guest nothing to do"
            )));
        }
        for m in memories {
            let mem = size(m).map_err(|e| BenchError::Input(format!("{mem_flag}: {e}")))?;
            if ws.saturating_add(GUEST_OWN) > mem {
                return Err(BenchError::Input(format!(
                    "{ws_flag} {set} does not fit in {mem_flag} {m}: the guest keeps {} for itself",
                    hover_vmm::config::size_text(GUEST_OWN)
                )));
            }
        }
    }
    Ok(())
}

/// `dir` is a directory this process can create files in (the flag
/// `flag`'s): checked with a file made and removed at once.
pub fn writable_dir(flag: &str, dir: &Path) -> Result<(), BenchError> {
    let bad = |why: String| BenchError::Input(format!("{flag} {}: {why}", dir.display()));
    if !dir.exists() {
        return Err(bad("does not exist".into()));
    }
    if !dir.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let probe = dir.join(format!(".hover-bench-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| bad(format!("cannot create a file in it: {e}")))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// `--out`: a writable directory, or one that can be made where the
/// nearest existing directory above it is writable; checked before
/// anything runs (a scenario that ran for minutes must not fail at its
/// last step), made only when results are written.
pub fn out_dir(dir: &Path) -> Result<(), BenchError> {
    if dir.exists() {
        return writable_dir("--out", dir);
    }
    let above = dir
        .ancestors()
        .skip(1)
        .find(|a| a.as_os_str().is_empty() || a.exists())
        .map(|a| {
            if a.as_os_str().is_empty() {
                Path::new(".")
            } else {
                a
            }
        })
        .unwrap_or(Path::new("/"));
    writable_dir("--out", above)
        .map_err(|e| BenchError::Input(format!("--out {}: cannot be made ({e})", dir.display())))
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
            ("0", "a guest needs some memory"),
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

    #[test]
    fn guest_parameters_are_checked_with_the_guests_table() {
        assert!(guest_param("--rate", "kvstore", "rate", "1000").is_ok());
        let e = guest_param("--rate", "kvstore", "rate", "99999999999")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--rate: ") && e.contains("rate=99999999999 is out of range"),
            "{e}"
        );
    }

    #[test]
    fn a_working_set_must_fit_its_memory() {
        let mem = v(&["256M", "1G"]);
        assert!(fits(("--wss", &v(&["16M", "64M"])), ("--memories", &mem)).is_ok());
        for (set, says) in [
            ("2G", "--wss 2G does not fit in --memories 256M"),
            ("250M", "--wss 250M does not fit in --memories 256M"),
            ("0", "--wss: a working set of 0 bytes"),
            ("16X", "--wss: '16X' is not a size"),
        ] {
            let e = fits(("--wss", &v(&[set])), ("--memories", &mem))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(says), "{e}");
        }
    }

    #[test]
    fn directories_are_checked_before_anything_runs() {
        let base = std::env::temp_dir().join(format!("hover-flags-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let out = base.join("a/b");
        out_dir(&out).unwrap();
        assert!(
            !out.exists(),
            "--out is made when results are written, not by the check"
        );
        let file = base.join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = out_dir(&file).unwrap_err().to_string();
        assert!(
            e.starts_with("--out ") && e.ends_with("not a directory"),
            "{e}"
        );
        let e = out_dir(&file.join("under")).unwrap_err().to_string();
        assert!(e.contains("cannot be made"), "{e}");
        assert!(out_dir(Path::new("relative-missing/x")).is_ok());
        let e = writable_dir("--dir", &base.join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("does not exist"), "{e}");
        assert!(writable_dir("--dir", &base).is_ok());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
