//! The gateway's client connections: at most `gateway.max_connections` in
//! all and `gateway.max_connections_per_ip` from one address. When a new
//! connection finds no room, the oldest of those still waiting for a
//! complete request head (or SOCKS handshake) is closed to make room: a
//! slow or silent client cannot lock others out. Connections carrying a
//! request or a tunnel are never closed for room; with none waiting, the
//! new one is refused.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lock;

/// Waiting for a request head, a SOCKS handshake, or the next request on a
/// kept-alive connection: may be closed to make room.
const WAITING: u8 = 0;
/// Carrying a request (its head was read).
const BUSY: u8 = 1;
/// Carrying a tunnel.
const TUNNEL: u8 = 2;

/// What one connection is doing, shared by its task, its head guard and
/// the registry.
#[derive(Debug)]
pub(super) struct ConnState {
    phase: AtomicU8,
    /// When it began waiting for its current head, in ms since the
    /// registry's epoch: the oldest waiting is closed first.
    waiting_since: AtomicU64,
    /// Bumped each time a new head is awaited, so the head guard counts
    /// each head from its first byte.
    heads: AtomicU64,
    /// It gave the token (or none is needed).
    authed: AtomicBool,
    epoch: Instant,
}

impl ConnState {
    fn new(epoch: Instant, authed: bool) -> ConnState {
        ConnState {
            phase: AtomicU8::new(WAITING),
            waiting_since: AtomicU64::new(epoch.elapsed().as_millis() as u64),
            heads: AtomicU64::new(0),
            authed: AtomicBool::new(authed),
            epoch,
        }
    }

    /// A request's head was read: it is being handled.
    pub fn busy(&self) {
        let _ = self
            .phase
            .compare_exchange(WAITING, BUSY, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Its answer was sent: the connection waits for its next head.
    pub fn waiting(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.waiting_since.store(now, Ordering::Release);
        if self
            .phase
            .compare_exchange(BUSY, WAITING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.heads.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// It carries a tunnel now, for the rest of its life.
    pub fn tunnel(&self) {
        self.phase.store(TUNNEL, Ordering::Release);
    }

    /// True while it waits for a head.
    pub fn is_waiting(&self) -> bool {
        self.phase.load(Ordering::Acquire) == WAITING
    }

    /// Which head it is waiting for (see [`ConnState::waiting`]).
    pub fn head(&self) -> u64 {
        self.heads.load(Ordering::Acquire)
    }

    /// It gave the token.
    pub fn authenticated(&self) {
        self.authed.store(true, Ordering::Release);
    }

    /// True once it gave the token, or when there is none.
    pub fn is_authed(&self) -> bool {
        self.authed.load(Ordering::Acquire)
    }
}

struct Entry {
    ip: IpAddr,
    conn: Arc<ConnState>,
    close: CancellationToken,
}

#[derive(Default)]
struct Open {
    next: u64,
    conns: HashMap<u64, Entry>,
    per_ip: HashMap<IpAddr, usize>,
}

impl Open {
    /// The oldest waiting connection, of `ip` alone if given.
    fn oldest_waiting(&self, ip: Option<IpAddr>) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, e)| ip.is_none_or(|ip| e.ip == ip) && e.conn.is_waiting())
            .min_by_key(|(id, e)| (e.conn.waiting_since.load(Ordering::Acquire), **id))
            .map(|(id, _)| *id)
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.conns.remove(&id)?;
        if let Some(n) = self.per_ip.get_mut(&e.ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&e.ip);
            }
        }
        Some(e)
    }
}

/// Why a new connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Full {
    /// Every slot carries a request or a tunnel.
    Total,
    /// Every slot of its address carries a request or a tunnel.
    PerIp,
}

/// The open connections, bounded in all and per client address.
pub(super) struct Slots {
    max: usize,
    per_ip: usize,
    /// Connections start authenticated when there is no token.
    authed: bool,
    epoch: Instant,
    open: Mutex<Open>,
}

/// One admitted connection's place; frees it on drop. Held by the
/// connection's task and by its tunnel.
pub(super) struct Slot {
    slots: Arc<Slots>,
    id: u64,
    /// What it is doing.
    pub conn: Arc<ConnState>,
    /// Cancelled when it is closed to make room.
    pub close: CancellationToken,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.slots.open).remove(self.id);
    }
}

impl Slots {
    /// Room for `max` connections, `per_ip` from one address; `token`:
    /// whether clients must authenticate.
    pub fn new(max: usize, per_ip: usize, token: bool) -> Arc<Slots> {
        Arc::new(Slots {
            max,
            per_ip,
            authed: !token,
            epoch: Instant::now(),
            open: Mutex::default(),
        })
    }

    /// A slot for a new connection from `ip`, closing the oldest waiting
    /// connection (of that address, when it is the address that is at its
    /// cap) to make room; `Err` when no connection may be closed. The
    /// second value is true when one was closed.
    pub fn admit(self: &Arc<Slots>, ip: IpAddr) -> Result<(Slot, bool), Full> {
        let ip = ip.to_canonical();
        let mut open = lock(&self.open);
        let mut evicted = false;
        let mine = open.per_ip.get(&ip).copied().unwrap_or(0);
        let victim = if mine >= self.per_ip {
            Some(open.oldest_waiting(Some(ip)).ok_or(Full::PerIp)?)
        } else if open.conns.len() >= self.max {
            Some(open.oldest_waiting(None).ok_or(Full::Total)?)
        } else {
            None
        };
        if let Some(id) = victim
            && let Some(e) = open.remove(id)
        {
            e.close.cancel();
            evicted = true;
        }
        let id = open.next;
        open.next += 1;
        let conn = Arc::new(ConnState::new(self.epoch, self.authed));
        let close = CancellationToken::new();
        open.conns.insert(
            id,
            Entry {
                ip,
                conn: conn.clone(),
                close: close.clone(),
            },
        );
        *open.per_ip.entry(ip).or_default() += 1;
        drop(open);
        let slot = Slot {
            slots: self.clone(),
            id,
            conn,
            close,
        };
        Ok((slot, evicted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    // Connections opened in the same millisecond are ordered by admission.
    #[test]
    fn the_oldest_waiting_connection_makes_room() {
        let slots = Slots::new(3, 3, false);
        let (a, _) = slots.admit(ip(1)).unwrap();
        let (b, _) = slots.admit(ip(2)).unwrap();
        let (c, _) = slots.admit(ip(3)).unwrap();
        // `a` carries a request: `b` is the oldest still waiting.
        a.conn.busy();
        let (d, evicted) = slots.admit(ip(4)).unwrap();
        assert!(evicted);
        assert!(b.close.is_cancelled() && !a.close.is_cancelled() && !c.close.is_cancelled());
        drop(b);
        // Every other one carries something: the new one is refused.
        c.conn.busy();
        d.conn.tunnel();
        assert_eq!(slots.admit(ip(5)).err(), Some(Full::Total));
        // A connection between requests waits again, from now.
        a.conn.waiting();
        assert!(slots.admit(ip(5)).is_ok());
        assert!(a.close.is_cancelled());
    }

    #[test]
    fn one_address_makes_room_among_its_own() {
        let slots = Slots::new(10, 2, true);
        let (a, _) = slots.admit(ip(1)).unwrap();
        let (b, _) = slots.admit(ip(2)).unwrap();
        let (c, _) = slots.admit(ip(1)).unwrap();
        assert!(!a.conn.is_authed());
        // The third from 127.0.0.1 closes its own oldest, never 127.0.0.2's.
        let (_d, evicted) = slots.admit(ip(1)).unwrap();
        assert!(evicted && a.close.is_cancelled() && !b.close.is_cancelled());
        c.conn.busy();
        _d.conn.busy();
        assert_eq!(slots.admit(ip(1)).err(), Some(Full::PerIp));
        // IPv4-mapped IPv6 is the same address.
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(slots.admit(mapped).err(), Some(Full::PerIp));
        assert!(slots.admit(ip(3)).is_ok());
    }
}
