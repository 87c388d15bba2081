//! Received bytes, per request when decode counts its KV received: every
//! token of the prompt holds prefill's byte for that token in decode's
//! blocks, the last block's tail is zero (the byte-level oracles of a
//! single case, `transferred-or-zeroed` above all, at block granularity),
//! and the state holds prefill's state.

use super::{finding, Finding, LifecycleOracle, View};
use crate::lifecycle::content::{state_byte, token_byte};
use crate::lifecycle::operation::Engine;
use crate::lifecycle::record::Event;
use crate::lifecycle::shape::TOKEN_BYTES;

/// The oracle's name.
pub const NAME: &str = "received-bytes";

/// The oracle.
pub struct ReceivedBytes;

impl LifecycleOracle for ReceivedBytes {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, event: &Event, view: &View<'_>) -> Vec<Finding> {
        let Event::Received { request } = *event else {
            return Vec::new();
        };
        let Some(info) = view.ledger.requests.get(request as usize) else {
            return Vec::new();
        };
        let per = view.shape.block_tokens(Engine::Decode);
        let mut wrong = 0usize;
        let mut first = None;
        for (j, &b) in info.decode_blocks.iter().enumerate() {
            let (offset, len) = view.pools.span(b);
            let bytes = view.pools.read(Engine::Decode, offset, len);
            for (k, &got) in bytes.iter().enumerate() {
                let t = j as u32 * per + k as u32 / TOKEN_BYTES;
                let want = if t < info.prompt {
                    token_byte(request, t, k as u32 % TOKEN_BYTES)
                } else {
                    0
                };
                if got != want {
                    wrong += 1;
                    first.get_or_insert((b, t));
                }
            }
        }
        if let Some(s) = info.decode_state {
            let (offset, len) = view.pools.span(s);
            let bytes = view.pools.read(Engine::Decode, offset, len);
            for (k, &got) in bytes.iter().enumerate() {
                if got != state_byte(request, k as u32) {
                    wrong += 1;
                }
            }
        }
        match first {
            Some((b, t)) => vec![finding(
                NAME,
                view,
                Some(request),
                format!(
                    "r{request} received with {wrong} byte(s) wrong, the first in {b} (token {t})"
                ),
            )],
            None if wrong > 0 => vec![finding(
                NAME,
                view,
                Some(request),
                format!("r{request} received with {wrong} byte(s) of its state wrong"),
            )],
            None => Vec::new(),
        }
    }

    fn finish(&mut self, _: &View<'_>) -> Vec<Finding> {
        Vec::new()
    }
}
