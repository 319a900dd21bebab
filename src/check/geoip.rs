//! Country lookups in a MaxMind-format (.mmdb) country database.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::proxy::Country;

/// Why the GeoIP database could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot open GeoIP database {}: {source}", path.display())]
pub struct GeoipError {
    /// The database file.
    pub path: PathBuf,
    /// What the reader said.
    pub source: maxminddb::MaxMindDbError,
}

/// An opened country database.
pub struct Geoip {
    reader: maxminddb::Reader<Vec<u8>>,
}

impl std::fmt::Debug for Geoip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Geoip")
            .field("database", &self.reader.metadata().database_type)
            .finish()
    }
}

impl Geoip {
    /// Reads the whole database into memory (country databases are a few MB).
    pub fn open(path: &Path) -> Result<Geoip, GeoipError> {
        let reader = maxminddb::Reader::open_readfile(path).map_err(|source| GeoipError {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Geoip { reader })
    }

    /// The country of `ip`: where MaxMind places it, else where its block
    /// is registered. `None` for addresses the database does not cover.
    pub fn country(&self, ip: IpAddr) -> Option<Country> {
        let found = self.reader.lookup(ip).ok()?;
        let record: maxminddb::geoip2::Country = found.decode().ok()??;
        record
            .country
            .iso_code
            .or(record.registered_country.iso_code)
            .and_then(Country::parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_database_countries() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/geoip/GeoLite2-Country-Test.mmdb");
        let db = Geoip::open(&path).unwrap();
        let c = |ip: &str| db.country(ip.parse().unwrap()).map(|c| c.to_string());
        assert_eq!(c("81.2.69.160").as_deref(), Some("GB"));
        assert_eq!(c("50.114.0.1").as_deref(), Some("US"));
        assert_eq!(c("67.43.156.1").as_deref(), Some("BT"));
        assert_eq!(c("127.0.0.1"), None);
        assert!(Geoip::open(Path::new("/nonexistent.mmdb")).is_err());
    }
}
