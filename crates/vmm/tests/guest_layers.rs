//! The built-in guest's layering (crates/guest/src): workloads reach the
//! runtime through its API module only, so the kernel's internals can
//! change without touching them. The compiler cannot enforce this (the
//! kernel's modules are visible to `arch/` and `drivers/`, hence to
//! workloads too): this test does.

use std::path::Path;

#[test]
fn workloads_use_the_kernel_api_module_only() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest/src/workloads");
    let mut checked = 0;
    let mut bad = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("crates/guest/src/workloads") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let mut rest = code;
            while let Some(at) = rest.find("crate::") {
                let path_here = &rest[at..];
                // `crate::kernel::api` and the API's crate-root macro only.
                let ok = path_here.starts_with("crate::kernel::api")
                    || path_here.starts_with("crate::println!");
                if !ok {
                    bad.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
                }
                rest = &path_here["crate::".len()..];
            }
        }
        checked += 1;
    }
    assert!(
        checked > 10,
        "found {checked} workload files in {}",
        dir.display()
    );
    assert!(
        bad.is_empty(),
        "workloads reaching past kernel::api:\n{}",
        bad.join("\n")
    );
}
