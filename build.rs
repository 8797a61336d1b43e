//! Link settings for the binaries.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Pack the binary's relative relocations (DT_RELR): about 30,000 of them take 720 KB as
    // ordinary `.rela.dyn` entries, every page of which the loader reads at start-up and keeps
    // mapped, against 8 KB packed. The binary stays position-independent (docs/benchmarks.md, *Intake*,
    // idle memory). Only glibc 2.36 and later can load such a binary (the image's Debian 12
    // has 2.36), so it is done only when building on such a system for itself: a build on an
    // older one, or for another target, links as before and runs where it was built.
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let native = std::env::var("HOST").ok() == std::env::var("TARGET").ok();
    if os == "linux" && env == "gnu" && native && glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether this system's glibc (`getconf GNU_LIBC_VERSION`: "glibc 2.36") is at least
/// `major.minor`; false when it cannot tell.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else {
        return false;
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}
