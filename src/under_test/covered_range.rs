//! The remote-sized sub-blocks a transfer covered, as a receive
//! post-process entry names them: a count `N` (sub-blocks `0..N`; vLLM
//! 0.33.0 and before) or a range `start..stop` (0.34.0, whose pairing from
//! the last token can leave sub-blocks uncovered at the head of the list as
//! well as at its tail). Driver results and v2 traces hold `N` or
//! `[start, stop]`; a range that starts at 0 is written as its count, so a
//! trace of an older release reads and writes as it always did.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Sub-blocks `start..stop` of a request's local blocks, in remote-sized
/// units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CoveredRange {
    /// The first covered sub-block.
    pub start: u64,
    /// One past the last covered sub-block.
    pub stop: u64,
}

impl CoveredRange {
    /// Sub-blocks `0..count`.
    pub fn from_start(count: u64) -> CoveredRange {
        CoveredRange {
            start: 0,
            stop: count,
        }
    }
}

impl fmt::Display for CoveredRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == 0 {
            write!(f, "{}", self.stop)
        } else {
            write!(f, "{}..{}", self.start, self.stop)
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Written {
    Count(u64),
    Range([u64; 2]),
}

impl<'de> Deserialize<'de> for CoveredRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Written::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "covered sub-blocks: expected a count N or a range [start, stop]",
            )
        })? {
            Written::Count(n) => Ok(CoveredRange::from_start(n)),
            Written::Range([start, stop]) if start <= stop => Ok(CoveredRange { start, stop }),
            Written::Range([start, stop]) => Err(serde::de::Error::custom(format!(
                "covered sub-blocks [{start}, {stop}]: start after stop"
            ))),
        }
    }
}

impl Serialize for CoveredRange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.start == 0 {
            s.serialize_u64(self.stop)
        } else {
            [self.start, self.stop].serialize(s)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_and_a_range_read_and_write_back_as_written() {
        for (text, range) in [
            ("7", CoveredRange::from_start(7)),
            ("[2,9]", CoveredRange { start: 2, stop: 9 }),
        ] {
            let read: CoveredRange = serde_json::from_str(text).unwrap();
            assert_eq!(read, range);
            assert_eq!(serde_json::to_string(&read).unwrap(), text);
        }
        let zero_start: CoveredRange = serde_json::from_str("[0,4]").unwrap();
        assert_eq!(serde_json::to_string(&zero_start).unwrap(), "4");
        assert_eq!(CoveredRange { start: 2, stop: 9 }.to_string(), "2..9");
    }

    #[test]
    fn a_backwards_or_malformed_range_is_refused() {
        for text in ["[9,2]", "[1]", "\"3\"", "-1", "[1,2,3]"] {
            assert!(
                serde_json::from_str::<CoveredRange>(text).is_err(),
                "{text}"
            );
        }
    }
}
