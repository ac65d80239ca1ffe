//! Lays out the release binary's code so that a running VMM maps little of
//! it: the functions a VM runs (`code-order.txt`, written by
//! `scripts/code-order.sh`) come first, together. The kernel maps the
//! 64 KiB around each code page a process touches; scattered over the
//! binary, a VM's ~0.9 MiB of code made ~3 MiB of it resident.
//!
//! Only where the link is LLD's (Rust 1.90 and later link
//! x86_64-unknown-linux-gnu with it unless told otherwise): other linkers
//! lack `--symbol-ordering-file`. `HOVER_CODE_ORDER=off` turns it off.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=code-order.txt");
    println!("cargo:rerun-if-env-changed=HOVER_CODE_ORDER");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    if env("PROFILE") != "release" || env("HOVER_CODE_ORDER") == "off" {
        return;
    }
    if let Some(why) = no_lld(
        &env("TARGET"),
        &env("RUSTC"),
        &env("CARGO_ENCODED_RUSTFLAGS"),
    ) {
        println!(
            "cargo:warning=release code not ordered ({why}): a VMM's resident memory is larger"
        );
        return;
    }
    let order = std::path::Path::new(&env("CARGO_MANIFEST_DIR")).join("code-order.txt");
    if !order.exists() {
        println!(
            "cargo:warning=release code not ordered: no {}",
            order.display()
        );
        return;
    }
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    // Names the binary no longer has (a stale list) are skipped, not errors.
    println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
}

/// Why this build does not link with LLD, if it does not.
fn no_lld(target: &str, rustc: &str, rustflags: &str) -> Option<String> {
    if target != "x86_64-unknown-linux-gnu" {
        return Some(format!("target {target}"));
    }
    if std::env::var_os("RUSTC_LINKER").is_some() {
        return Some("a linker is configured".into());
    }
    if [
        "linker=",
        "linker-features=-lld",
        "link-self-contained=-linker",
    ]
    .iter()
    .any(|f| rustflags.contains(f))
    {
        return Some("RUSTFLAGS choose the linker".into());
    }
    let version = Command::new(rustc).arg("-V").output().ok()?;
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    // "rustc 1.95.0 (...)"
    let minor: u32 = version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    (minor < 90).then(|| format!("{}: older than 1.90", version.trim()))
}
