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
    symbol_order();
}

/// The functions a release `director serve` runs from start-up to idle, laid out together
/// (`link/startup-order.txt`, made by `link/order.sh`): the kernel maps a program's code
/// around each page it first runs, 64 KB at a time, so about 2 MB of them scattered over the
/// 20 MB of code kept 10 MB of it resident at idle (docs/benchmarks.md, *Intake*, idle memory). Only
/// with LLD, rustc's own linker for this target, and no other linker asked for; names the
/// list no longer matches (another compiler, other features) are passed over, and the
/// binary is laid out as without it.
fn symbol_order() {
    const LIST: &str = "link/startup-order.txt";
    println!("cargo:rerun-if-changed={LIST}");
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let target = std::env::var("TARGET").unwrap_or_default();
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    // A linker asked for in the flags or set for the target (`RUSTC_LINKER`, Cargo's resolved
    // `target.<triple>.linker`) may not be LLD.
    let other_linker = flags.contains("linker") || std::env::var_os("RUSTC_LINKER").is_some();
    let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let list = std::path::Path::new(&dir).join(LIST);
    // `-Wl,` splits its argument at commas.
    let passable = !list.to_string_lossy().contains(',');
    if target == "x86_64-unknown-linux-gnu"
        && release
        && !other_linker
        && passable
        && list.is_file()
    {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={},--no-warn-symbol-ordering",
            list.display()
        );
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
