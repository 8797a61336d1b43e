//! Link settings for the binaries.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Pack the binary's relative relocations (DT_RELR, glibc 2.36 and later, as in the
    // image's Debian 12): about 30,000 of them take 720 KB as ordinary `.rela.dyn` entries,
    // every page of which the loader reads at start-up and keeps mapped, against a few KB
    // packed. The binary stays position-independent. README, *Intake*, idle memory.
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
