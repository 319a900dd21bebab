//! Where pages go: one JSON line per page (to a file or stdout), failed
//! pages also to `failed.jsonl` beside the output file, and bodies by hash.
//! Lines of a batch of pages are written whole just before the batch's
//! commit, which records the lengths written; a resumed crawl cuts the
//! files back to them, so no line is ever doubled or torn. Lines wait in
//! memory and are written on the blocking pool, never from an async worker.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Meta keys of the committed lengths.
pub const OUT_LEN: &str = "output_len";
/// Meta key of the committed length of `failed.jsonl`.
pub const FAILED_LEN: &str = "failed_len";

enum Target {
    /// With the lines not yet written.
    Stdout(Vec<u8>),
    /// A file created when its first line is written, so that a crawl
    /// where nothing failed leaves no empty `failed.jsonl`; with the lines
    /// not yet written.
    Unopened(PathBuf, Vec<u8>),
    /// `len` counts the bytes in `pending` too.
    File {
        file: File,
        len: u64,
        pending: Vec<u8>,
    },
}

impl Target {
    fn open(path: &Path, keep: Option<u64>) -> io::Result<Target> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        let on_disk = file.metadata()?.len();
        // A crawl starting afresh replaces the file; a resumed one keeps
        // what it committed and drops lines of pages it will fetch again.
        let len = keep.unwrap_or(0).min(on_disk);
        file.set_len(len)?;
        let mut t = Target::File {
            file,
            len,
            pending: Vec::new(),
        };
        if let Target::File { file, .. } = &mut t {
            use std::io::Seek;
            file.seek(io::SeekFrom::Start(len))?;
        }
        Ok(t)
    }

    /// Queues `line` for the next [`Target::flush`]; no I/O.
    fn line(&mut self, line: &[u8]) {
        match self {
            Target::Stdout(pending) | Target::Unopened(_, pending) => {
                pending.extend_from_slice(line)
            }
            Target::File { len, pending, .. } => {
                pending.extend_from_slice(line);
                *len += line.len() as u64;
            }
        }
    }

    /// True when lines wait to be written.
    fn pending(&self) -> bool {
        match self {
            Target::Stdout(p) | Target::Unopened(_, p) | Target::File { pending: p, .. } => {
                !p.is_empty()
            }
        }
    }

    /// Writes the queued lines (creating the file first if need be).
    /// Blocks.
    fn flush(&mut self) -> io::Result<()> {
        if let Target::Unopened(path, pending) = self
            && !pending.is_empty()
        {
            let lines = std::mem::take(pending);
            *self = Target::open(path, None)?;
            self.line(&lines);
        }
        match self {
            Target::Stdout(pending) if !pending.is_empty() => {
                let mut out = io::stdout().lock();
                out.write_all(pending)?;
                pending.clear();
                out.flush()
            }
            Target::File { file, pending, .. } if !pending.is_empty() => {
                file.write_all(pending)?;
                pending.clear();
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn len(&self) -> Option<u64> {
        match self {
            Target::Stdout(_) => None,
            Target::Unopened(_, pending) => Some(pending.len() as u64),
            Target::File { len, .. } => Some(*len),
        }
    }
}

/// The crawl's outputs.
pub struct Sink {
    out: Target,
    failed: Option<Target>,
    failed_path: Option<PathBuf>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("failed_path", &self.failed_path)
            .finish()
    }
}

impl Sink {
    /// Pages to `output` (stdout when `None`) and failed pages also to
    /// `failed.jsonl` beside it, each cut back to its committed length when
    /// resuming (`None`: start afresh). The files are opened on the
    /// blocking pool.
    pub async fn open(
        output: Option<PathBuf>,
        out_len: Option<u64>,
        failed_len: Option<u64>,
    ) -> io::Result<Sink> {
        tokio::task::spawn_blocking(move || Sink::open_here(output.as_deref(), out_len, failed_len))
            .await
            .map_err(io::Error::other)?
    }

    /// [`Sink::open`] on this thread. Blocks.
    fn open_here(
        output: Option<&Path>,
        out_len: Option<u64>,
        failed_len: Option<u64>,
    ) -> io::Result<Sink> {
        let Some(path) = output else {
            return Ok(Sink {
                out: Target::Stdout(Vec::new()),
                failed: None,
                failed_path: None,
            });
        };
        let failed_path = path.parent().unwrap_or(Path::new("")).join("failed.jsonl");
        let failed = match failed_len {
            Some(n) if n > 0 => Target::open(&failed_path, failed_len)?,
            // Nothing committed to keep: what an earlier crawl left goes,
            // as it would be cut to nothing, and the file comes with the
            // first failed page.
            _ => {
                match std::fs::remove_file(&failed_path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
                Target::Unopened(failed_path.clone(), Vec::new())
            }
        };
        Ok(Sink {
            out: Target::open(path, out_len)?,
            failed: Some(failed),
            failed_path: Some(failed_path),
        })
    }

    /// Queues a page's line (and, when it failed, to `failed.jsonl`) for
    /// the next [`Sink::flush`].
    pub fn page(&mut self, line: &serde_json::Value, failed: bool) -> io::Result<()> {
        let mut bytes = serde_json::to_vec(line).map_err(io::Error::other)?;
        bytes.push(b'\n');
        self.out.line(&bytes);
        if failed && let Some(f) = &mut self.failed {
            f.line(&bytes);
        }
        Ok(())
    }

    /// [`Sink::flush`] on this thread, for a crawl on a thread of its own.
    /// Blocks.
    pub fn flush_here(&mut self) -> io::Result<()> {
        self.out.flush()?;
        match &mut self.failed {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }

    /// Writes the queued lines, before the commit of their pages, on the
    /// blocking pool.
    pub async fn flush(&mut self) -> io::Result<()> {
        if !self.out.pending() && !self.failed.as_ref().is_some_and(Target::pending) {
            return Ok(());
        }
        let mut out = std::mem::replace(&mut self.out, Target::Stdout(Vec::new()));
        let mut failed = self.failed.take();
        let (out, failed, written) = tokio::task::spawn_blocking(move || {
            let mut write = || -> io::Result<()> {
                out.flush()?;
                if let Some(f) = &mut failed {
                    f.flush()?;
                }
                Ok(())
            };
            let written = write();
            (out, failed, written)
        })
        .await
        .map_err(io::Error::other)?;
        self.out = out;
        self.failed = failed;
        written
    }

    /// The lengths to commit with the pages written.
    pub fn offsets(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        if let Some(n) = self.out.len() {
            v.push((OUT_LEN, n.to_string()));
        }
        if let Some(n) = self.failed.as_ref().and_then(Target::len) {
            v.push((FAILED_LEN, n.to_string()));
        }
        v
    }

    /// Where failed pages go, when they go to a file.
    pub fn failed_path(&self) -> Option<&Path> {
        self.failed_path.as_deref()
    }
}

/// Stores `body` as `dir/<sha256>` unless it is there already.
pub async fn store_body(dir: &Path, sha256: &str, body: &[u8]) -> io::Result<()> {
    let path = dir.join(sha256);
    if tokio::fs::try_exists(&path).await.unwrap_or(false) {
        return Ok(());
    }
    // Written aside and renamed, so a crash never leaves half a body under
    // a hash it does not have.
    let tmp = dir.join(format!(".{sha256}.tmp"));
    tokio::fs::write(&tmp, body).await?;
    tokio::fs::rename(&tmp, &path).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn failed_jsonl_comes_only_with_a_failed_page() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages.jsonl");
        let failed = dir.path().join("failed.jsonl");
        let mut sink = Sink::open(Some(path.clone()), None, None).await.unwrap();
        sink.page(&serde_json::json!({"url": "a"}), false).unwrap();
        sink.flush().await.unwrap();
        drop(sink);
        assert!(!failed.exists(), "an empty failed.jsonl was created");
        let mut sink = Sink::open(Some(path.clone()), None, None).await.unwrap();
        sink.page(&serde_json::json!({"url": "b", "error": "x"}), true)
            .unwrap();
        sink.flush().await.unwrap();
        assert_eq!(std::fs::read_to_string(&failed).unwrap().lines().count(), 1);
    }

    #[tokio::test]
    async fn resumed_outputs_are_cut_back_to_the_committed_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages.jsonl");
        let mut sink = Sink::open(Some(path.clone()), None, None).await.unwrap();
        sink.page(&serde_json::json!({"url": "a"}), false).unwrap();
        let committed = sink.offsets();
        sink.page(&serde_json::json!({"url": "b", "error": "x"}), true)
            .unwrap();
        sink.flush().await.unwrap();
        drop(sink);
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
        let out_len = committed[0].1.parse().unwrap();
        let failed_len = committed[1].1.parse().unwrap();
        let mut sink = Sink::open(Some(path.clone()), Some(out_len), Some(failed_len))
            .await
            .unwrap();
        sink.page(&serde_json::json!({"url": "c"}), false).unwrap();
        sink.flush().await.unwrap();
        drop(sink);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "{\"url\":\"a\"}\n{\"url\":\"c\"}\n");
        // Nothing failed was committed: no failed.jsonl, not an empty one.
        assert!(!dir.path().join("failed.jsonl").exists());
        // Afresh: replaced.
        let sink = Sink::open(Some(path.clone()), None, None).await.unwrap();
        drop(sink);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
    }
}
