//! Output shared by the scenarios: Markdown tables on stdout, JSON files.

use std::path::Path;

use serde::Serialize;

use crate::BenchError;

/// Print a Markdown table.
pub fn print(headers: &[&str], rows: &[Vec<String>]) {
    println!("| {} |", headers.join(" | "));
    println!("|{}", "---|".repeat(headers.len()));
    for r in rows {
        println!("| {} |", r.join(" | "));
    }
}

/// Write `doc` as pretty JSON to `out/name`, creating `out`.
pub fn write_json(out: &Path, name: &str, doc: &impl Serialize) -> Result<(), BenchError> {
    std::fs::create_dir_all(out).map_err(|source| BenchError::Write {
        path: out.display().to_string(),
        source,
    })?;
    let path = out.join(name);
    let json = serde_json::to_string_pretty(doc).map_err(|e| BenchError::Write {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(&path, json).map_err(|source| BenchError::Write {
        path: path.display().to_string(),
        source,
    })?;
    println!("wrote {}", path.display());
    Ok(())
}
