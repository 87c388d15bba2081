//! The bytes a block must hold: each request's token provenance (what
//! prefill computes for its tokens), its mamba state, and the sentinel its
//! blocks get at allocation. Provenance bytes are in 1..=127, sentinels in
//! 128..=255, so that neither is ever mistaken for the other or for zero.

use super::operation::RequestId;

/// The byte `k` of token `token` of request `request`'s KV.
pub fn token_byte(request: RequestId, token: u32, k: u32) -> u8 {
    let h = mix(u64::from(request) << 40 ^ u64::from(token) << 8 ^ u64::from(k));
    1 + (h % 127) as u8
}

/// The byte `k` of request `request`'s mamba state.
pub fn state_byte(request: RequestId, k: u32) -> u8 {
    let h = mix(u64::from(request) << 40 ^ 0xfff0_0000 ^ u64::from(k));
    1 + (h % 127) as u8
}

/// The byte a block allocated to `request` holds before anything writes it.
pub fn sentinel_byte(request: RequestId) -> u8 {
    128 + (mix(u64::from(request) ^ 0x5e47_1e11) % 128) as u8
}

/// SplitMix64's finaliser.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provenance_sentinel_and_zero_never_meet() {
        for r in 0..50 {
            assert!(sentinel_byte(r) >= 128);
            for t in 0..50 {
                let b = token_byte(r, t, 3);
                assert!((1..=127).contains(&b));
            }
            assert!((1..=127).contains(&state_byte(r, 5)));
        }
    }
}
