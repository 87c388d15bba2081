//! Scenarios drawn from a geometry: from a seed (the command and the
//! property tests) or from raw bytes (the fuzz target), through one
//! [`Entropy`] source. Most draws move a live request on (the reference
//! model says how); the others submit, land a pair in any order, abort on
//! either engine, fail prefill, preempt, or let a heartbeat interval pass
//! with heartbeats sent or missed.

use super::content::mix;
use super::model::ReferenceModel;
use super::operation::{Engine, Operation};
use super::runner::Scenario;
use super::shape::LifecycleShape;

/// Where a generator's choices come from.
pub trait Entropy {
    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: u32) -> u32;
}

/// A seeded source (SplitMix64).
pub struct Seeded(pub u64);

impl Entropy for Seeded {
    fn below(&mut self, n: u32) -> u32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (mix(self.0) % u64::from(n.max(1))) as u32
    }
}

/// A source reading bytes (a fuzzer's input); zeros once they run out.
pub struct Bytes<'a>(pub &'a [u8]);

impl Entropy for Bytes<'_> {
    fn below(&mut self, n: u32) -> u32 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        u32::from(b) % n.max(1)
    }
}

/// Operations per request a scenario draws.
pub const OPERATIONS_PER_REQUEST: u32 = 10;

/// Heartbeat intervals a stalled decode misses in a row: one more than a
/// heartbeat extends a lease by, so that the lease expires.
pub const STALL_INTERVALS: u32 = super::kvgeom_connector::HEARTBEAT_EXTENSION as u32 + 1;

/// The seed of scenario `index` of a run seeded `seed` on geometry `name`.
pub fn scenario_seed(seed: u64, name: &str, index: u32) -> u64 {
    let mut h = seed ^ 0x6c69_6665_6379_636c;
    for b in name.bytes() {
        h = mix(h ^ u64::from(b));
    }
    mix(h ^ u64::from(index))
}

/// A scenario of `requests` requests on `shape`.
pub fn draw(
    shape: &LifecycleShape,
    requests: u32,
    seed: u64,
    entropy: &mut dyn Entropy,
) -> Scenario {
    let requests = requests.max(1);
    let mut model = ReferenceModel::default();
    let mut operations = Vec::new();
    let mut submitted = 0;
    let length = requests * OPERATIONS_PER_REQUEST;
    let max_hit = shape.blocks_for(Engine::Decode, shape.max_prompt());
    for _ in 0..length {
        let live = model.live();
        let roll = entropy.below(100);
        let op = if submitted < requests && (live.is_empty() || roll < 15) {
            submitted += 1;
            let prompt = shape.prompts[entropy.below(shape.prompts.len() as u32) as usize];
            let prefix_hit_blocks = if shape.prefix_caching {
                entropy.below(max_hit.max(1))
            } else {
                0
            };
            Operation::Submit {
                prompt,
                prefix_hit_blocks,
            }
        } else if roll < 35 {
            Operation::Deliver {
                pick: entropy.below(64),
            }
        } else if roll < 42 {
            if entropy.below(4) == 0 {
                // A stalled decode: heartbeats missed for longer than a
                // heartbeat extends the lease.
                for _ in 1..STALL_INTERVALS {
                    operations.push(Operation::Tick { missed: true });
                }
            }
            Operation::Tick {
                missed: entropy.below(2) == 0,
            }
        } else if live.is_empty() {
            Operation::Tick { missed: false }
        } else {
            let r = live[entropy.below(live.len() as u32) as usize];
            match roll {
                42..=46 => Operation::Abort {
                    request: r,
                    engine: if entropy.below(2) == 0 {
                        Engine::Decode
                    } else {
                        Engine::Prefill
                    },
                },
                47..=49 => Operation::FailPrefill { request: r },
                50..=51 => Operation::Preempt { request: r },
                _ => match model.next(r, entropy.below(2) == 0) {
                    Some(op) => op,
                    None => Operation::Tick { missed: false },
                },
            }
        };
        model.apply(&op);
        operations.push(op);
    }
    Scenario {
        seed,
        requests,
        operations,
    }
}
