//! The documentation stays inside the repository: no path outside it,
//! every relative link in README.md, CONTRIBUTING.md, CHANGELOG.md,
//! docs/*.md and docs/bench/README.md names a file that exists (and a heading there, for a link
//! to one), and every script they name is in the repository.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut docs: Vec<PathBuf> = [
        "README.md",
        "CONTRIBUTING.md",
        "CHANGELOG.md",
        "docs/bench/README.md",
    ]
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
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = doc.parent().unwrap().join(file);
            if file.is_empty() || !resolved.exists() {
                bad.push(format!("{name}: link to {target} resolves to nothing"));
            } else if !anchor.is_empty()
                && file.ends_with(".md")
                && !anchors(&std::fs::read_to_string(&resolved).unwrap())
                    .contains(&anchor.to_string())
            {
                bad.push(format!("{name}: link to {target}: no such heading"));
            } else if !resolved
                .canonicalize()
                .unwrap()
                .starts_with(root().canonicalize().unwrap())
            {
                bad.push(format!("{name}: link to {target} leaves the repository"));
            }
        }
        for script in scripts(&text) {
            if !root().join(&script).exists() {
                bad.push(format!(
                    "{name}: names {script}, which is not in the repository"
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The anchors of a Markdown file's headings, as GitHub makes them:
/// lower case, punctuation dropped, spaces as hyphens.
fn anchors(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

/// The `scripts/...` paths a text names.
fn scripts(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("scripts/") {
        let path: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "/._-".contains(*c))
            .collect();
        let path = path.trim_end_matches(['.', '/']).to_string();
        // A folder or a pattern (`scripts/lab/SCENARIO.sh`) is not a script.
        if path
            .rsplit('/')
            .next()
            .is_some_and(|f| f.contains('.') && f == f.to_lowercase())
        {
            out.push(path);
        }
        rest = &rest[i + "scripts/".len()..];
    }
    out
}

#[test]
fn anchors_and_scripts_are_found_as_github_and_a_shell_would() {
    assert_eq!(
        anchors("## Live migration (seeds 3 and 4)\n### Post-copy (seeds 1 + 3 + 4)"),
        ["live-migration-seeds-3-and-4", "post-copy-seeds-1--3--4"]
    );
    assert_eq!(
        scripts("run `scripts/kvm-lab.sh run x` or scripts/lab/SCENARIO.sh."),
        ["scripts/kvm-lab.sh"]
    );
}

#[test]
fn the_links_are_found() {
    assert_eq!(
        links("see [a](docs/A.md) and [b](B.md#x)."),
        ["docs/A.md", "B.md#x"]
    );
}

/// README's results table cites, for each command, the newest run of that
/// command in docs/BENCHMARKS.md: a row whose date is older than a
/// section there that ran the same command is stale.
#[test]
fn readme_results_cite_the_newest_run_of_each_command() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let bench = std::fs::read_to_string(root().join("docs/BENCHMARKS.md")).unwrap();
    let results = readme
        .split("\n## Results")
        .nth(1)
        .expect("README's results");
    let rows: Vec<&str> = results
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| mechanism"))
        .collect();
    assert!(rows.len() >= 8, "{rows:?}");
    // Each `### ` section of BENCHMARKS with the date in its heading.
    let sections: Vec<(String, &str)> = bench
        .split("\n### ")
        .skip(1)
        .filter_map(|s| dates(s.lines().next().unwrap_or("")).pop().map(|d| (d, s)))
        .collect();
    let mut bad = Vec::new();
    for row in rows {
        let cell = row.split(" | ").nth(3).unwrap_or("");
        let pieces: Vec<&str> = cell.split('`').collect();
        for pair in pieces[1..].chunks(2) {
            let (command, after) = (pair[0], pair.get(1).copied().unwrap_or(""));
            let Some(cited) = dates(after).pop() else {
                bad.push(format!("{command}: no date in {cell}"));
                continue;
            };
            let ran: Vec<&String> = sections
                .iter()
                .filter(|(_, s)| s.contains(&format!("{command}`")))
                .map(|(d, _)| d)
                .collect();
            match ran.iter().max() {
                None => bad.push(format!("{command}: no section of BENCHMARKS.md ran it")),
                Some(newest) if **newest > cited => bad.push(format!(
                    "{command}: README cites {cited}, BENCHMARKS.md has a run of {newest}"
                )),
                Some(_) if !ran.contains(&&cited) => bad.push(format!(
                    "{command}: no section of BENCHMARKS.md dated {cited} ran it"
                )),
                Some(_) => {}
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Each row of README's results table points at its section of
/// docs/RESULTS.md (the current figures, one section per mechanism) and at
/// a plot that exists; that section ran the row's commands on the row's
/// dates and shows the same plot.
#[test]
fn each_results_row_has_its_current_section_and_plot() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let results = std::fs::read_to_string(root().join("docs/RESULTS.md")).unwrap();
    let table = readme
        .split("\n## Results")
        .nth(1)
        .expect("README's results");
    let mut bad = Vec::new();
    for row in table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| mechanism"))
    {
        let cells: Vec<&str> = row.split(" | ").collect();
        let (cited, last) = (cells.get(3).copied().unwrap_or(""), cells.last().unwrap());
        let targets = links(last);
        let Some(section) = targets
            .iter()
            .find_map(|t| t.strip_prefix("docs/RESULTS.md#"))
        else {
            bad.push(format!(
                "{}: no link to its section of docs/RESULTS.md",
                cells[0]
            ));
            continue;
        };
        let Some(plot) = targets.iter().find(|t| t.ends_with(".svg")) else {
            bad.push(format!("{}: no plot", cells[0]));
            continue;
        };
        if !root().join(plot).exists() {
            bad.push(format!("{}: plot {plot} does not exist", cells[0]));
        }
        // The section: from its heading to the next `## `.
        let text = results
            .split("\n## ")
            .find(|s| anchors(&format!("## {}", s.lines().next().unwrap_or(""))) == [section])
            .unwrap_or("");
        if text.is_empty() {
            bad.push(format!(
                "{}: docs/RESULTS.md has no section #{section}",
                cells[0]
            ));
            continue;
        }
        let plot_there = plot.trim_start_matches("docs/");
        if !text.contains(plot_there) {
            bad.push(format!("#{section} does not show {plot_there}"));
        }
        let pieces: Vec<&str> = cited.split('`').collect();
        for pair in pieces[1..].chunks(2) {
            let (command, after) = (pair[0], pair.get(1).copied().unwrap_or(""));
            let date = dates(after).pop().unwrap_or_default();
            if !text.contains(command) || !text.contains(&date) {
                bad.push(format!("#{section} does not cite `{command}` of {date}"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The YYYY-MM-DD dates in a text, in order.
fn dates(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    (0..b.len().saturating_sub(9))
        .filter(|&i| {
            let d = &b[i..i + 10];
            d[..4].iter().all(u8::is_ascii_digit)
                && d[4] == b'-'
                && d[5..7].iter().all(u8::is_ascii_digit)
                && d[7] == b'-'
                && d[8..].iter().all(u8::is_ascii_digit)
        })
        .map(|i| text[i..i + 10].to_string())
        .collect()
}
