//! MongoDB ObjectId (the BSON ObjectId specification, MongoDB manual
//! "ObjectId"): 4-byte big-endian seconds, a 5-byte
//! random value per process (older drivers put a machine id and the process
//! id there), a 3-byte counter that starts at a random value.
//!
//! The `bson` crate's generator lets the counter wrap silently, so a process
//! that makes more than 2^24 ids in one second repeats ids. Ours treats
//! `(seconds, counter)` as one 56-bit number that only grows: a wrap carries
//! into the seconds (the id borrows the next second), and the generator
//! waits, boundedly, rather than run more than a second ahead of the clock.
//! A clock that steps back is handled by a [`RollbackPolicy`], as for the
//! 64-bit generators (default: refuse at once).
//! Convert to `bson::oid::ObjectId` with `ObjectId::from_bytes(id.bytes())`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::{ConvertError, GenerateError, ParseError};
use crate::generator::RollbackPolicy;
use crate::sync::{AtomicU64, Ordering};
use crate::timestamp::rfc3339_ms;
use crate::wait::{Attempt, Step, block_on};

const COUNTER_BITS: u32 = 24;
const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;
/// The furthest ahead of the clock, in seconds, an ObjectId may be stamped.
const MAX_LEAD_SECS: u64 = 1;

/// A 12-byte MongoDB ObjectId.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId([u8; 12]);

impl ObjectId {
    /// From raw bytes.
    pub const fn from_bytes(bytes: [u8; 12]) -> Self {
        ObjectId(bytes)
    }
    /// The raw bytes.
    pub const fn bytes(&self) -> [u8; 12] {
        self.0
    }
    /// Seconds since the Unix epoch.
    pub fn seconds(&self) -> u32 {
        u32::from_be_bytes([self.0[0], self.0[1], self.0[2], self.0[3]])
    }
    /// The 5-byte per-process random value.
    pub fn random(&self) -> [u8; 5] {
        [self.0[4], self.0[5], self.0[6], self.0[7], self.0[8]]
    }
    /// The 3-byte counter.
    pub fn counter(&self) -> u32 {
        u32::from_be_bytes([0, self.0[9], self.0[10], self.0[11]])
    }
    /// The time as RFC 3339.
    pub fn timestamp(&self) -> String {
        rfc3339_ms(u64::from(self.seconds()) * 1000)
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// 24 hex digits, any case, surrounding whitespace ignored. Other text is a
/// typed [`ParseError`]: [`ParseError::Empty`],
/// [`ParseError::WrongLength`] or [`ParseError::InvalidChar`].
///
/// ```
/// use shardflake::{ObjectId, ParseError};
/// let oid: ObjectId = "6553f1000102030405fffffe".parse()?;
/// assert_eq!(oid.seconds(), 1_700_000_000);
/// assert_eq!(oid.to_string().parse::<ObjectId>()?, oid);
/// assert!(matches!("6553f1".parse::<ObjectId>(), Err(ParseError::WrongLength { expected: 24, found: 6, .. })));
/// assert!(matches!("6553f1000102030405fffffg".parse::<ObjectId>(), Err(ParseError::InvalidChar { ch: 'g', .. })));
/// # Ok::<(), ParseError>(())
/// ```
impl FromStr for ObjectId {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(ParseError::Empty);
        }
        if let Some(ch) = s.chars().find(|c| !c.is_ascii_hexdigit()) {
            return Err(ParseError::InvalidChar {
                format: "objectid",
                input: s.to_string(),
                ch,
            });
        }
        if s.len() != 24 {
            return Err(ParseError::WrongLength {
                kind: "objectid",
                input: s.to_string(),
                expected: 24,
                found: s.len(),
            });
        }
        let mut bytes = [0u8; 12];
        for (b, pair) in bytes.iter_mut().zip(s.as_bytes().chunks_exact(2)) {
            // Both are ASCII hex digits (checked above).
            let hi = (pair[0] as char).to_digit(16).unwrap_or(0) as u8;
            let lo = (pair[1] as char).to_digit(16).unwrap_or(0) as u8;
            *b = hi << 4 | lo;
        }
        Ok(ObjectId(bytes))
    }
}

/// The 12 bytes as they are (big-endian seconds, random, counter).
impl From<[u8; 12]> for ObjectId {
    fn from(bytes: [u8; 12]) -> Self {
        ObjectId(bytes)
    }
}

/// The 12 bytes.
impl From<ObjectId> for [u8; 12] {
    fn from(oid: ObjectId) -> Self {
        oid.0
    }
}

/// Exactly 12 bytes; another length is [`ConvertError::WrongLength`].
///
/// ```
/// use shardflake::{ConvertError, ObjectId};
/// let bytes = [0x65, 0x53, 0xf1, 0, 1, 2, 3, 4, 5, 0xff, 0xff, 0xfe];
/// let oid = ObjectId::try_from(&bytes[..])?;
/// assert_eq!(oid.as_ref(), &bytes[..]);
/// assert_eq!(oid, ObjectId::from(bytes));
/// assert_eq!(<[u8; 12]>::from(oid), bytes);
/// assert_eq!(
///     ObjectId::try_from(&bytes[..11]),
///     Err(ConvertError::WrongLength { kind: "objectid", expected: 12, found: 11 })
/// );
/// # Ok::<(), ConvertError>(())
/// ```
impl TryFrom<&[u8]> for ObjectId {
    type Error = ConvertError;
    fn try_from(bytes: &[u8]) -> Result<Self, ConvertError> {
        <[u8; 12]>::try_from(bytes)
            .map(ObjectId)
            .map_err(|_| ConvertError::WrongLength {
                kind: "objectid",
                expected: 12,
                found: bytes.len(),
            })
    }
}

/// The 12 bytes.
impl AsRef<[u8]> for ObjectId {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Makes ObjectIds that never repeat; thread-safe and lock-free.
///
/// ```
/// use shardflake::objectid::ObjectIdGenerator;
/// let generator = ObjectIdGenerator::new();
/// let a = generator.next_id()?;
/// let b = generator.next_id()?;
/// assert_ne!(a, b);
/// assert_eq!(a.random(), b.random());
/// # Ok::<(), shardflake::GenerateError>(())
/// ```
#[derive(Debug)]
pub struct ObjectIdGenerator<C = SystemClock> {
    /// `seconds << 24 | counter` of the last id.
    state: AtomicU64,
    random: [u8; 5],
    clock: C,
    rollback: RollbackPolicy,
    stall_timeout: Duration,
}

impl ObjectIdGenerator<SystemClock> {
    /// A generator with fresh random bytes and counter, on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }
}

impl Default for ObjectIdGenerator<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> ObjectIdGenerator<C> {
    /// A generator with fresh random bytes and counter start.
    pub fn with_clock(clock: C) -> Self {
        let mut seed = [0u8; 8];
        // Without an OS RNG, fall back to the clock: still unique within the process.
        if getrandom::fill(&mut seed).is_err() {
            seed = (clock.now_ms_precise() ^ 0x9e37_79b9_7f4a_7c15).to_le_bytes();
        }
        let counter = u64::from_le_bytes([seed[5], seed[6], seed[7], 0, 0, 0, 0, 0]);
        Self::with_parts(
            clock,
            [seed[0], seed[1], seed[2], seed[3], seed[4]],
            counter,
        )
    }

    /// A generator with given random bytes and counter start (for tests).
    pub fn with_parts(clock: C, random: [u8; 5], counter_start: u64) -> Self {
        // The state holds the last id; the first id takes the counter start.
        let state = (counter_start & COUNTER_MASK).wrapping_sub(1) & COUNTER_MASK;
        ObjectIdGenerator {
            state: AtomicU64::new(state),
            random,
            clock,
            rollback: RollbackPolicy::Error,
            stall_timeout: Duration::from_secs(1),
        }
    }

    /// What to do when the clock reads earlier than the last id's second
    /// (default: [`RollbackPolicy::Error`]). `Continue { max }` keeps
    /// counting on the last second while the clock is at most `max` behind.
    pub fn on_rollback(mut self, policy: RollbackPolicy) -> Self {
        self.rollback = policy;
        self
    }

    /// The next ObjectId; waits (boundedly) when the counter borrowed a
    /// second or the rollback policy says wait.
    pub fn next_id(&self) -> Result<ObjectId, GenerateError> {
        block_on(|a| self.try_next_id(a))
    }

    /// [`ObjectIdGenerator::next_id`] that never sleeps; see [`crate::wait`].
    pub fn try_next_id(&self, attempt: &mut Attempt) -> Result<Step<ObjectId>, GenerateError> {
        let ride_secs = match self.rollback {
            RollbackPolicy::Continue { max } => max.as_secs() + u64::from(max.subsec_nanos() > 0),
            _ => 0,
        };
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let now_ms = self.clock.now_ms();
            let now = (now_ms / 1000).min(u64::from(u32::MAX));
            // The counter runs on across seconds, as the spec has it; a wrap
            // within a second carries into the seconds instead of repeating.
            let carried = cur + 1;
            let fresh = (now << COUNTER_BITS) | (carried & COUNTER_MASK);
            let next = carried.max(fresh);
            let secs = next >> COUNTER_BITS;
            if secs > u64::from(u32::MAX) {
                return Err(GenerateError::EpochExhausted {
                    layout: "objectid".into(),
                    end_ms: (u128::from(u32::MAX) + 1) * 1000,
                });
            }
            if secs > now + MAX_LEAD_SECS + ride_secs {
                // Further ahead than a wrap explains: the clock stepped back
                // from the last id's second.
                let last_secs = cur >> COUNTER_BITS;
                if last_secs > now + MAX_LEAD_SECS {
                    let behind_ms = last_secs.saturating_mul(1000).saturating_sub(now_ms);
                    let refuse = match self.rollback {
                        RollbackPolicy::Error => true,
                        RollbackPolicy::Wait { max } | RollbackPolicy::Continue { max } => {
                            u128::from(behind_ms) > max.as_millis()
                        }
                    };
                    if refuse {
                        return Err(GenerateError::ClockMovedBackwards { behind_ms });
                    }
                }
                let until_ms = (secs - MAX_LEAD_SECS - ride_secs).saturating_mul(1000);
                let ahead = Duration::from_millis(until_ms.saturating_sub(now_ms).max(1));
                return Ok(Step::Wait(attempt.wait(ahead, self.stall_timeout)?));
            }
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Ok(Step::Ready(
                        self.compose(secs as u32, (next & COUNTER_MASK) as u32),
                    ));
                }
                Err(actual) => cur = actual,
            }
        }
    }

    fn compose(&self, secs: u32, counter: u32) -> ObjectId {
        let mut b = [0u8; 12];
        b[..4].copy_from_slice(&secs.to_be_bytes());
        b[4..9].copy_from_slice(&self.random);
        b[9..].copy_from_slice(&counter.to_be_bytes()[1..]);
        ObjectId(b)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn layout_and_text() {
        let g = ObjectIdGenerator::with_parts(
            ManualClock::new(1_700_000_000_500),
            [1, 2, 3, 4, 5],
            0xFFFFFE,
        );
        let a = g.next_id().unwrap();
        assert_eq!(a.to_string(), "6553f1000102030405fffffe");
        assert_eq!(
            (a.seconds(), a.random(), a.counter()),
            (1_700_000_000, [1, 2, 3, 4, 5], 0xFFFFFE)
        );
        assert_eq!(a.to_string().parse::<ObjectId>(), Ok(a));
        assert!("xyz".parse::<ObjectId>().is_err());
        assert!("zz53f100010203040500fffe".parse::<ObjectId>().is_err());
        assert_eq!(a.timestamp(), "2023-11-14T22:13:20.000Z");
    }

    #[test]
    fn more_than_2_pow_24_in_one_second_never_repeats() {
        // The clock stands still: bson's generator would wrap and repeat here.
        let clock = ManualClock::new(1_700_000_000_000);
        let g = ObjectIdGenerator::with_parts(clock.clone(), [0; 5], 7);
        let mut last = None;
        for _ in 0..(1u32 << 24) + 10 {
            let id = g.next_id().unwrap();
            // Strictly increasing, hence no repeat.
            assert!(Some(id) > last, "{id} after {last:?}");
            last = Some(id);
        }
        // The wrap borrowed the next second; a further second's worth must wait.
        assert_eq!(last.unwrap().seconds(), 1_700_000_001);
        clock.advance(1000);
        assert!(g.next_id().unwrap() > last.unwrap());
    }

    #[test]
    fn a_clock_stepped_back_follows_the_rollback_policy() {
        use crate::wait::{Attempt, Step};
        let clock = ManualClock::new(1_700_000_010_000);
        let id = |g: &ObjectIdGenerator<ManualClock>| g.try_next_id(&mut Attempt::new());
        // Error (the default): refused at once, not after a wait.
        let g = ObjectIdGenerator::with_parts(clock.clone(), [0; 5], 7);
        let before = g.next_id().unwrap();
        clock.set(1_700_000_000_000);
        assert_eq!(
            id(&g),
            Err(GenerateError::ClockMovedBackwards { behind_ms: 10_000 })
        );
        // Wait: a step within the bound is a wait for the caller, not a spin.
        let g = g.on_rollback(RollbackPolicy::Wait {
            max: Duration::from_secs(10),
        });
        assert!(matches!(id(&g), Ok(Step::Wait(d)) if d >= Duration::from_secs(1)));
        let g = g.on_rollback(RollbackPolicy::Wait {
            max: Duration::from_secs(5),
        });
        assert!(matches!(
            id(&g),
            Err(GenerateError::ClockMovedBackwards { .. })
        ));
        // Continue: counts on in the last second, still increasing.
        let g = g.on_rollback(RollbackPolicy::Continue {
            max: Duration::from_secs(10),
        });
        let Ok(Step::Ready(after)) = id(&g) else {
            panic!("continue must issue")
        };
        assert!(after > before);
        assert_eq!(after.seconds(), before.seconds());
        // The clock back: fresh seconds again.
        clock.set(1_700_000_020_000);
        assert_eq!(g.next_id().unwrap().seconds(), 1_700_000_020);
    }

    #[test]
    fn two_threads_past_2_pow_24_in_one_second_never_repeat() {
        // Where bson repeated millions of ids: two threads, one second.
        let g = ObjectIdGenerator::with_parts(ManualClock::new(1_700_000_000_000), [0; 5], 7);
        let per_thread = (1usize << 23) + 1000;
        let [a, b] = std::thread::scope(|s| {
            [0, 1]
                .map(|_| {
                    s.spawn(|| {
                        (0..per_thread)
                            .map(|_| g.next_id().unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .map(|t| t.join().unwrap())
        });
        for ids in [&a, &b] {
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "a thread's ids went down"
            );
        }
        // Both runs are sorted: one merge pass finds any id in both.
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            assert_ne!(a[i], b[j], "id issued to both threads");
            if a[i] < b[j] { i += 1 } else { j += 1 }
        }
        let last = a.last().max(b.last()).unwrap();
        assert_eq!(
            last.seconds(),
            1_700_000_001,
            "the wrap borrowed one second"
        );
    }
}
