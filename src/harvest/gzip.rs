//! Lists compressed with gzip but served without `Content-Encoding` (big
//! list files, `.gz` downloads, local files): recognised by their magic
//! bytes and decompressed, the body limit applying to the decompressed
//! size so that a small bomb cannot take the daemon's memory.

use std::io::Read;

/// A gzip member starts with these bytes: the magic number and deflate,
/// the only compression method gzip defines.
const MAGIC: [u8; 3] = [0x1f, 0x8b, 0x08];

/// Why a gzip body could not be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum GunzipError {
    /// More than the limit once decompressed.
    #[error("larger than the limit once decompressed")]
    TooLarge,
    /// Not valid gzip after all.
    #[error("gzip body could not be decompressed: {0}")]
    Corrupt(String),
}

/// True when `body` starts like a gzip stream.
pub fn is_gzip(body: &[u8]) -> bool {
    body.starts_with(&MAGIC)
}

/// Decompresses every member of `body`, failing once more than `max`
/// bytes come out.
pub fn gunzip(body: &[u8], max: u64) -> Result<Vec<u8>, GunzipError> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(body)
        .take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| GunzipError::Corrupt(e.to_string()))?;
    if out.len() as u64 > max {
        return Err(GunzipError::TooLarge);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn round_trip_limit_and_corruption() {
        let list = b"1.2.3.4:80\n".repeat(100);
        let packed = gz(&list);
        assert!(is_gzip(&packed));
        assert!(!is_gzip(b"1.2.3.4:80"));
        assert_eq!(gunzip(&packed, list.len() as u64).unwrap(), list);
        assert_eq!(
            gunzip(&packed, list.len() as u64 - 1),
            Err(GunzipError::TooLarge)
        );
        // Two members, as `cat a.gz b.gz` makes.
        let mut two = packed.clone();
        two.extend_from_slice(&gz(b"5.6.7.8:81\n"));
        assert!(gunzip(&two, 1 << 20).unwrap().ends_with(b"5.6.7.8:81\n"));
        let cut = &packed[..packed.len() / 2];
        assert!(matches!(gunzip(cut, 1 << 20), Err(GunzipError::Corrupt(_))));
        // A bomb stops at the limit, having decompressed no more than that.
        let bomb = gz(&vec![b'0'; 64 << 20]);
        assert!(bomb.len() < 1 << 20);
        assert_eq!(gunzip(&bomb, 1 << 20), Err(GunzipError::TooLarge));
    }
}
