//! Address normalisation: an absolute address becomes (region index, offset
//! from the region's base), so that runs with different real addresses can
//! be compared row by row.

use std::fmt;

use serde::Serialize;

use crate::nixl::DescRow;

/// One memory region: `len` bytes from `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Region {
    /// Start address.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Region {
    /// A region of unknown size: everything from `base` up (an address then
    /// belongs to the nearest base below it).
    pub fn unbounded(base: u64) -> Self {
        Self {
            base,
            len: u64::MAX - base,
        }
    }

    /// Whether `addr` lies in the region.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.len
    }
}

/// Where an address lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Location {
    /// `offset` bytes past the base of region `region`.
    InRegion {
        /// The region's index in the map.
        region: usize,
        /// Bytes past the region's base.
        offset: u64,
    },
    /// In no region; the raw address.
    Outside {
        /// The address.
        addr: u64,
    },
}

/// A descriptor row with its address normalised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct NormRow {
    /// Where the row starts.
    pub at: Location,
    /// Length in bytes.
    pub len: u64,
}

impl fmt::Display for NormRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Location::InRegion { region, offset } => {
                write!(f, "(region {region}, +{offset}, len {})", self.len)
            }
            Location::Outside { addr } => {
                write!(f, "(outside every region: {addr:#x}, len {})", self.len)
            }
        }
    }
}

/// The regions of one side (the local worker, or one remote agent), in
/// region-index order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RegionMap {
    regions: Vec<Region>,
}

impl RegionMap {
    /// A map of these regions, in region-index order.
    pub fn new(regions: Vec<Region>) -> Self {
        Self { regions }
    }

    /// Regions from parallel lists of bases and lengths (extra entries of
    /// the longer list are ignored).
    pub fn from_bases(bases: &[u64], lens: &[u64]) -> Self {
        Self::new(
            bases
                .iter()
                .zip(lens)
                .map(|(&base, &len)| Region { base, len })
                .collect(),
        )
    }

    /// The regions, in region-index order.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// Whether the map has no region.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The region holding `addr`; when regions overlap, the one whose base
    /// is closest below `addr` (then the lowest index).
    pub fn locate(&self, addr: u64) -> Location {
        self.regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.contains(addr))
            .min_by_key(|(i, r)| (addr - r.base, *i))
            .map_or(Location::Outside { addr }, |(region, r)| {
                Location::InRegion {
                    region,
                    offset: addr - r.base,
                }
            })
    }

    /// `row` with its address made region-relative.
    pub fn normalize(&self, row: DescRow) -> NormRow {
        NormRow {
            at: self.locate(row.addr),
            len: row.len,
        }
    }

    /// The absolute address of a location in this map; `None` for an
    /// unknown region or an outside address.
    pub fn address(&self, at: Location) -> Option<u64> {
        match at {
            Location::InRegion { region, offset } => self
                .regions
                .get(region)
                .and_then(|r| r.base.checked_add(offset)),
            Location::Outside { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_map_to_region_and_offset() {
        let map = RegionMap::from_bases(&[1000, 5000], &[100, 50]);
        assert_eq!(
            map.locate(1099),
            Location::InRegion {
                region: 0,
                offset: 99
            }
        );
        assert_eq!(
            map.locate(5000),
            Location::InRegion {
                region: 1,
                offset: 0
            }
        );
        assert_eq!(map.locate(1100), Location::Outside { addr: 1100 });
        assert_eq!(map.locate(999), Location::Outside { addr: 999 });
        let row = map.normalize(DescRow {
            addr: 5010,
            len: 6,
            dev: 0,
        });
        assert_eq!(row.to_string(), "(region 1, +10, len 6)");
        assert_eq!(
            map.normalize(DescRow {
                addr: 16,
                len: 6,
                dev: 0
            })
            .to_string(),
            "(outside every region: 0x10, len 6)"
        );
        assert_eq!(map.address(row.at), Some(5010));
    }

    #[test]
    fn unbounded_regions_end_at_the_next_base() {
        let map = RegionMap::new(vec![Region::unbounded(0x2000), Region::unbounded(0x1000)]);
        assert_eq!(
            map.locate(0x1fff),
            Location::InRegion {
                region: 1,
                offset: 0xfff
            }
        );
        assert_eq!(
            map.locate(u64::MAX - 1),
            Location::InRegion {
                region: 0,
                offset: u64::MAX - 1 - 0x2000
            }
        );
        assert_eq!(map.locate(0xfff), Location::Outside { addr: 0xfff });
    }

    #[test]
    fn overlapping_regions_prefer_the_nearest_base() {
        let map = RegionMap::from_bases(&[0, 64], &[1024, 64]);
        assert_eq!(
            map.locate(70),
            Location::InRegion {
                region: 1,
                offset: 6
            }
        );
        assert_eq!(
            map.locate(200),
            Location::InRegion {
                region: 0,
                offset: 200
            }
        );
    }
}
