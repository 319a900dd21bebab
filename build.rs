//! Names the commit the binary is built from, for `proxywarden --version`:
//! `PROXYWARDEN_COMMIT` is the short hash of HEAD, or `unknown` outside a git
//! checkout (a source tarball) or without git. Set the variable to override.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=PROXYWARDEN_COMMIT");
    let given = std::env::var("PROXYWARDEN_COMMIT")
        .ok()
        .filter(|c| !c.is_empty());
    let (commit, from) = match given {
        Some(c) => (c, "env"),
        None => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(c) => (c, "git"),
            None => ("unknown".to_owned(), "none"),
        },
    };
    println!("cargo:rustc-env=PROXYWARDEN_COMMIT={commit}");
    // Where the name came from, for the test that checks it.
    println!("cargo:rustc-env=PROXYWARDEN_COMMIT_FROM={from}");
    // Run again when HEAD moves: HEAD itself names the branch, the branch's
    // ref file (or packed-refs) holds the commit.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = PathBuf::from(dir);
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let common = git(&["rev-parse", "--git-common-dir"]).map_or(dir.clone(), PathBuf::from);
            println!(
                "cargo:rerun-if-changed={}",
                common.join(&reference).display()
            );
            println!(
                "cargo:rerun-if-changed={}",
                common.join("packed-refs").display()
            );
        }
    }
}
