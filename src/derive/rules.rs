//! Which vLLM release's rules a derivation applies: one value per release
//! kvgeom derives for ([`VLLM_RULES`]), holding every decision of
//! `kvgeom derive` that differs between releases. The derivation reads the
//! value; nothing else compares version strings.

/// The rules of one vLLM release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VllmRules {
    /// The release, as `vllm.__version__` reports it.
    pub release: &'static str,
    /// `CacheConfig.DEFAULT_BLOCK_SIZE`: the block vLLM starts from when no
    /// `--block-size` is given, kept when every attention backend supports
    /// it (else the backend's smallest kernel size), before a hybrid
    /// model's alignment.
    pub default_block_size: u64,
}

/// Every release `kvgeom derive` applies the rules of. The first is the
/// release the project pins (the first row of the release table,
/// `under_test::RELEASES`; a test holds the two together) and the default
/// of `kvgeom derive --release`.
pub static VLLM_RULES: [VllmRules; 2] = [
    // 0.34.0 raised `CacheConfig.DEFAULT_BLOCK_SIZE` to 64; the selector,
    // the kernel sizes and the hybrid alignment are 0.33.0's.
    VllmRules {
        release: "0.34.0",
        default_block_size: 64,
    },
    VllmRules {
        release: "0.33.0",
        default_block_size: 16,
    },
];

impl VllmRules {
    /// The rules of the pinned release: the default of `--release`.
    pub fn pinned() -> &'static VllmRules {
        &VLLM_RULES[0]
    }

    /// The rules of `release`, if kvgeom derives for it.
    pub fn of(release: &str) -> Option<&'static VllmRules> {
        VLLM_RULES.iter().find(|r| r.release == release)
    }

    /// The releases kvgeom derives for, oldest first, comma-separated (for
    /// messages).
    pub fn known() -> String {
        let mut releases: Vec<&str> = VLLM_RULES.iter().map(|r| r.release).collect();
        releases.reverse();
        releases.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_release_has_one_row_and_is_found_by_its_version() {
        for rules in &VLLM_RULES {
            assert!(std::ptr::eq(VllmRules::of(rules.release).unwrap(), rules));
        }
        assert_eq!(VllmRules::of("0.32.0"), None);
        assert_eq!(VllmRules::known(), "0.33.0, 0.34.0");
        assert_eq!(VllmRules::pinned().release, "0.34.0");
    }
}
