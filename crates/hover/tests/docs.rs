//! The documentation stays inside the repository: no path outside it, and
//! every relative link in README.md, CONTRIBUTING.md, CHANGELOG.md and
//! docs/*.md names a file that exists.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut docs: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    docs
}

/// The targets of `[text](target)` links in `text`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

#[test]
fn no_document_points_outside_the_repository_and_every_link_resolves() {
    let mut bad = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.file_name().unwrap().to_string_lossy().into_owned();
        if text.contains("../shared") {
            bad.push(format!("{name}: names ../shared, outside the repository"));
        }
        for target in links(&text) {
            if target.starts_with("http")
                || target.starts_with('#')
                || target.starts_with("mailto:")
            {
                continue;
            }
            let file = target.split('#').next().unwrap_or("");
            let resolved = doc.parent().unwrap().join(file);
            if file.is_empty() || !resolved.exists() {
                bad.push(format!("{name}: link to {target} resolves to nothing"));
            } else if !resolved
                .canonicalize()
                .unwrap()
                .starts_with(root().canonicalize().unwrap())
            {
                bad.push(format!("{name}: link to {target} leaves the repository"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_links_are_found() {
    assert_eq!(
        links("see [a](docs/A.md) and [b](B.md#x)."),
        ["docs/A.md", "B.md#x"]
    );
}
