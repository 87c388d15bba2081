//! The descriptor-level oracles applied to a vLLM trace: the traced lists
//! and transfers are re-issued with one agent name per rank, classified by
//! the harness's own layout model of the traced geometry, and checked for
//! containment, pairing, coverage and double writes.

use std::collections::HashMap;

use super::case::{ListRole, TraceCase};
use super::registration::{registration_is_modelled, NotTheTracedModel};
use super::replay::{block_ids_u32, traced_model, ReplayError};
use crate::geometry::{EngineGeometry, Geometry, KvLayout, Mode};
use crate::layout::{CaseLayout, LayoutError, RequestBlocks, Side};
use crate::nixl::{DlistHandle, DlistTarget, DryRun, Nixl, NixlError, Recording};
use crate::oracle::{pairing, registry, run_descriptor_level, OracleInput, OracleLevel, Violation};

/// The oracles' verdict on one trace.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// Every violation found, in the order the oracles ran.
    pub violations: Vec<Violation>,
    /// What could not be checked, and why.
    pub notes: Vec<String>,
    /// The checks that were not run, in the order [`SkippedCheck::ALL`]
    /// lists them (empty when every descriptor-level check ran).
    pub skipped: Vec<SkippedCheck>,
}

/// A descriptor-level check that `check_case` could not run on a trace
/// because it needs the prefill page the trace cannot hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SkippedCheck {
    /// Pairing's comparison of both ends' regions, tokens, heads and state
    /// slices (pair lengths are still compared).
    PairingBeyondLengths,
    /// Containment of every source row in the request's prefill blocks.
    PrefillContainment,
}

impl SkippedCheck {
    /// Every check that can be skipped, in report order.
    pub const ALL: [SkippedCheck; 2] = [
        SkippedCheck::PairingBeyondLengths,
        SkippedCheck::PrefillContainment,
    ];

    /// How reports name it.
    pub fn name(self) -> &'static str {
        match self {
            SkippedCheck::PairingBeyondLengths => "pairing beyond pair lengths",
            SkippedCheck::PrefillContainment => "prefill-side containment",
        }
    }
}

impl std::fmt::Display for SkippedCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a trace cannot be checked; each names the trace case first.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The traced model cannot be rebuilt.
    #[error("{case}: {source}")]
    Model {
        /// The trace case's name.
        case: String,
        /// Why the model cannot be rebuilt.
        #[source]
        source: ReplayError,
    },
    /// The trace records no remote rank to take prefill's geometry from.
    #[error("{0}: no remote rank")]
    NoRemote(String),
    /// The harness's layout model refused the traced geometry.
    #[error("{0}: layout model: {1}")]
    Layout(String, LayoutError),
    /// Re-issuing a traced call on the dry-run transport failed.
    #[error("{case}: {source}")]
    Transport {
        /// The trace case's name.
        case: String,
        /// The transport's refusal.
        #[source]
        source: NixlError,
    },
    /// A traced transfer names a list the trace never prepared.
    #[error("{0}: a transfer names an unknown list")]
    UnknownList(String),
    /// kvgeom's model of the traced geometry registers another list than
    /// vLLM did, so its layout model is not the traced one.
    #[error(transparent)]
    NotTheTracedModel(#[from] NotTheTracedModel),
}

fn layout_of(name: &str) -> KvLayout {
    if name == "LBHNC" {
        KvLayout::Hnd
    } else {
        KvLayout::Nhd
    }
}

/// The traced P/D geometry: D is the traced worker, P is what its remote
/// ranks advertised.
pub fn traced_geometry(case: &TraceCase) -> Result<Geometry, CheckError> {
    let model = traced_model(case).map_err(|source| CheckError::Model {
        case: case.name.clone(),
        source,
    })?;
    let remote = case
        .remotes
        .first()
        .ok_or_else(|| CheckError::NoRemote(case.name.clone()))?;
    let m = &remote.meta;
    let w = &case.worker;
    let ppl = m.physical_blocks_per_logical_kv_block.max(1);
    Ok(Geometry {
        name: case.name.clone(),
        description: format!("traced by vLLM: {}", case.meta.nodeid),
        model,
        prefill: EngineGeometry {
            tp_size: remote.tp_size,
            kernel_block: m.block_size,
            logical_block: m.block_size.saturating_mul(ppl),
            num_logical_blocks: Some(
                u32::try_from(m.num_blocks / u64::from(ppl)).unwrap_or(u32::MAX),
            ),
            layout: layout_of(&m.kv_cache_layout),
            host_buffer: false,
            prefix_caching: false,
            block_padding_bytes: 0,
        },
        decode: EngineGeometry {
            tp_size: w.tp_size,
            kernel_block: w.kernel_block_size,
            logical_block: w.local_block_size,
            num_logical_blocks: Some(w.num_logical_blocks),
            layout: layout_of(&case.local_geometry.kv_cache_layout),
            host_buffer: false,
            prefix_caching: false,
            block_padding_bytes: 0,
        },
        prompts: None,
        expect_rejection: None,
        stack: crate::geometry::Stack::Vllm,
        handshake: crate::geometry::HandshakeCompat::default(),
        sglang: None,
    })
}

/// Run the descriptor-level oracles on one traced case.
///
/// Some traces describe a prefill side that cannot exist: vLLM's test
/// harness advertises remote mamba state larger than the remote page (e.g.
/// 56 bytes of state in 48-byte pages), so its remote state rows run into
/// the next block. Such a prefill layout cannot be modelled; the decode side
/// (destination containment, coverage, double writes) is still checked,
/// pair lengths are compared, [`CheckReport::skipped`] names what was not
/// checked and a note says why.
pub fn check_case(case: &TraceCase) -> Result<CheckReport, CheckError> {
    let mut geometry = traced_geometry(case)?;
    registration_is_modelled(case)?;
    match check_with(case, &geometry, true) {
        Err(CheckError::Layout(
            _,
            LayoutError::MambaTooLarge {
                side: Side::Prefill,
                state,
                page,
            },
        )) => {
            // Enlarge the prefill pages in the model only to classify the
            // decode side; every prefill-side verdict is dropped.
            let grow = u32::try_from(state.div_ceil(page.max(1))).unwrap_or(u32::MAX);
            geometry.prefill.logical_block = geometry.prefill.logical_block.saturating_mul(grow);
            let mut report = check_with(case, &geometry, false)?;
            report.violations.retain(|v| v.side == Some(Side::Decode));
            report.skipped = SkippedCheck::ALL.to_vec();
            report.notes.push(format!(
                "prefill side not checked: the trace advertises {state} bytes of mamba state in {page}-byte prefill \
                 pages, so its remote state rows run past the request's prefill blocks (a geometry vLLM's \
                 scheduler cannot produce); skipped: {}; decode-side containment, coverage, double writes \
                 and pair lengths checked",
                skipped_names(&report.skipped)
            ));
            Ok(report)
        }
        other => other,
    }
}

/// `names` of `skipped`, comma-separated.
pub fn skipped_names(skipped: &[SkippedCheck]) -> String {
    let names: Vec<&str> = skipped.iter().map(|c| c.name()).collect();
    names.join(", ")
}

/// The request's blocks as the layout model takes them: decode's
/// prefix-hit blocks (`local_num_computed_blocks`, not in the request)
/// first, then the blocks the transfer fills.
fn traced_request_blocks(case: &TraceCase) -> RequestBlocks {
    let blocks = &case.request.blocks;
    let transfer = block_ids_u32(&blocks.local_block_ids);
    let mut decode = transfer.clone();
    if let Some(attention) = decode.first_mut() {
        let mut with_hit = case.prefix_hit_ids();
        with_hit.append(attention);
        *attention = with_hit;
    }
    RequestBlocks {
        decode,
        decode_transfer: transfer,
        prefill: block_ids_u32(&blocks.remote_block_ids),
    }
}

fn check_with(
    case: &TraceCase,
    geometry: &Geometry,
    both_sides: bool,
) -> Result<CheckReport, CheckError> {
    let geometry = geometry.clone();
    let request = traced_request_blocks(case);
    // A prefill rank this decode rank never handshook with gets the bases
    // of one it did: no pair names its agent, so nothing lands on it.
    let any_bases = case
        .remotes
        .first()
        .map(|r| r.meta.kv_caches_base_addr.clone())
        .unwrap_or_default();
    let mut remote_bases = vec![any_bases; geometry.prefill.tp_size as usize];
    for r in &case.remotes {
        if let Some(slot) = remote_bases.get_mut(r.tp_rank as usize) {
            *slot = r.meta.kv_caches_base_addr.clone();
        }
    }
    // The trace holds one decode rank of `tp_size`: every rank gets the
    // recorded bases (pairs are classified by agent name, so the others
    // are never matched) and only the recorded rank is judged.
    let decode_rank = case.worker.tp_rank;
    let decode_bases = vec![
        case.local_regions
            .iter()
            .map(|r| r.addr)
            .collect::<Vec<u64>>();
        geometry.decode.tp_size as usize
    ];
    let layout = CaseLayout::from_bases(
        geometry.clone(),
        Mode::Pull,
        request,
        decode_bases,
        case.worker.num_logical_blocks,
        remote_bases,
        geometry.prefill.num_logical_blocks.unwrap_or(0),
    )
    .map_err(|e| CheckError::Layout(case.name.clone(), e))?;
    // Re-issue the traced calls with one agent name per rank.
    let mut nixl = Recording::new(DryRun::new());
    let fail = |source: NixlError| CheckError::Transport {
        case: case.name.clone(),
        source,
    };
    let me = nixl
        .create_agent(&Side::Decode.agent_name(decode_rank))
        .map_err(fail)?;
    let mut handles: HashMap<u64, DlistHandle> = HashMap::new();
    for d in &case.dlists {
        let target = match d.role {
            ListRole::Remote { tp_rank, .. } => {
                let name = Side::Prefill.agent_name(tp_rank);
                nixl.add_remote_agent(me, name.as_bytes()).map_err(fail)?;
                DlistTarget::Remote(name)
            }
            _ => DlistTarget::Local,
        };
        let h = nixl
            .prepare_dlist(me, &target, d.mem, &d.list)
            .map_err(fail)?;
        handles.insert(d.handle.0, h);
    }
    for x in &case.xfers {
        let (Some(&l), Some(&r)) = (
            handles.get(&x.local_handle.0),
            handles.get(&x.remote_handle.0),
        ) else {
            return Err(CheckError::UnknownList(case.name.clone()));
        };
        let h = nixl
            .make_xfer(
                me,
                x.op,
                l,
                &x.local_ids,
                r,
                &x.remote_ids,
                x.notif_msg.as_deref().map(str::as_bytes),
            )
            .map_err(fail)?;
        nixl.post_xfer(me, h).map_err(fail)?;
    }
    let pairs = nixl.resolve(&layout);
    let prompt = case.request.prompt_len.unwrap_or(0);
    let mut input = OracleInput::new(layout, prompt, case.prefix_hit_tokens(), pairs);
    if let Some(m) = case.request.matched_tokens {
        input = input.with_transferred_tokens(m);
    }
    // Without prefill's side, pairing (which compares both ends) is reduced
    // to the pair lengths, which need no layout.
    let mut violations = if both_sides {
        run_descriptor_level(&input)
    } else {
        let mut v = registry::run_where(&input, |o| {
            o.level == OracleLevel::Descriptor && o.name != pairing::NAME
        });
        v.extend(pairing::check_lengths(&input));
        v
    };
    // The decode ranks the trace does not hold made no transfers here.
    violations.retain(|v| v.side != Some(Side::Decode) || v.rank.is_none_or(|r| r == decode_rank));
    Ok(CheckReport {
        violations,
        ..CheckReport::default()
    })
}
