//! Build the built-in guest (crates/guest) and hand its ELF to the library,
//! which embeds it, so that `hover run` needs no file besides itself.
//!
//! The guest is a freestanding program with its own profile and link flags, so
//! it is built by a nested cargo into its own target directory: sharing the
//! outer target directory would block on cargo's build lock.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let guest_dir = manifest_dir
        .join("../guest")
        .canonicalize()
        .expect("crates/guest exists");
    let abi_dir = manifest_dir.join("../abi");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("set by cargo"));
    let target_dir = out_dir.join("guest-target");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());

    let mut cmd = Command::new(cargo);
    cmd.current_dir(&guest_dir)
        .args(["build", "--release", "--locked", "--bin", "hover-guest"])
        .arg("--target-dir")
        .arg(&target_dir);
    // Flags meant for the host crates (or for clippy, which wraps rustc) must
    // not reach the guest; its own .cargo/config.toml sets what it needs.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .expect("could not run cargo to build the guest");
    assert!(
        status.success(),
        "building the built-in guest (crates/guest) failed"
    );

    let elf = target_dir.join("release/hover-guest");
    println!("cargo:rustc-env=HOVER_GUEST_ELF={}", elf.display());
    for dir in [guest_dir.join("src"), abi_dir.join("src")] {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    for file in [
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "linker.ld",
        ".cargo/config.toml",
    ] {
        println!("cargo:rerun-if-changed={}", guest_dir.join(file).display());
    }
    println!(
        "cargo:rerun-if-changed={}",
        abi_dir.join("Cargo.toml").display()
    );
}
