//! A small tmpfs mounted by a test (tests and CI run as root here), so that
//! a database can fill a real file system; unmounted when the guard drops,
//! also when the test fails.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted on a directory; unmounted on drop.
pub struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it: `3m`,
    /// `392k`) on `at`, creating the directory. Says why when mounting is
    /// impossible here (not root, no `mount`), for the test to skip.
    pub fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            at: at.to_path_buf(),
        })
    }

    /// A tmpfs for a test, or `None` after saying plainly why the test is
    /// skipped.
    pub fn for_test(at: &Path, size: &str) -> Option<Tmpfs> {
        match Tmpfs::mount(at, size) {
            Ok(fs) => Some(fs),
            Err(why) => {
                eprintln!(
                    "SKIPPED: this test needs a tmpfs of its own, mounted as root, and \
                     mounting one is impossible here: {why}"
                );
                None
            }
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.at
    }

    /// Changes its size (`mount -o remount,size=…`): larger to give room
    /// back, or down to what it holds to leave none.
    pub fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.at)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "remount to {size}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// KiB in use.
    pub fn used_kib(&self) -> u64 {
        let out = Command::new("df")
            .args(["-k", "--output=used"])
            .arg(&self.at)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("df said {text:?}"))
    }

    /// Leaves no room but what SQLite needs to open a database whose log
    /// and shared memory were removed at its last close: 32 KiB for the
    /// shared memory and 4 KiB for an empty log file. The first frame of
    /// the log (a page and its header) needs more, so every write fails.
    pub fn fill_but_open(&self) {
        self.resize(&format!("{}k", self.used_kib() + 36));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let done = Command::new("umount").arg(&self.at).status();
        if !done.is_ok_and(|s| s.success()) {
            // Busy (a process the test started still holds a file): detach
            // it now, the kernel frees it once the last file is closed.
            let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        }
    }
}
