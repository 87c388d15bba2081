//! Registration of an engine rank's KV tensors: the regions (one per shared
//! tensor), their per-kernel-block length and stride, and the derived block
//! counts, as vLLM's `register_kv_caches` computes them.

use crate::geometry::{EngineGeometry, ModelSpec, SubRegion};
use crate::nixl::{MemKind, MemRegion};

/// One KV tensor handed to the connector: a layer slot shared by all groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvTensor {
    /// Start address of the tensor.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One NIXL region (a distinct tensor base address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub base: u64,
    /// Bytes of one kernel block.
    pub block_len: u64,
    /// Bytes between consecutive kernel blocks.
    pub block_stride: u64,
    /// Kernel blocks in the region.
    pub num_blocks: u64,
    /// REPLICATE (MLA): read whole on every rank. Otherwise SPLIT (head-sharded).
    pub replicated: bool,
}

/// The outcome of registering one rank's KV tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// One per distinct tensor base address, in registration order.
    pub regions: Vec<Region>,
    /// Indices of regions holding mamba state, in registration order.
    pub ssm_regions: Vec<usize>,
    /// Kernel block size in tokens (the worker's `block_size` after sync).
    pub kernel_block: u32,
    /// Kernel blocks per logical block.
    pub ppl: u32,
    /// Logical blocks per region (`_logical_num_blocks`).
    pub num_logical_blocks: u64,
    /// Kernel blocks per region (`num_blocks`).
    pub num_kernel_blocks: u64,
    /// Conv sub-projections of one mamba page (local geometry).
    pub conv_offsets: Vec<SubRegion>,
    /// `(conv_size, ssm_size)` of this rank; `(0, 0)` without mamba.
    pub ssm_sizes: (u64, u64),
    /// Memory registration entries (one per distinct tensor).
    pub memory: Vec<MemRegion>,
    /// Memory type of the tensors.
    pub mem: MemKind,
    /// Device ordinal of the tensors.
    pub device: u32,
}

impl Registration {
    /// Register `tensors` (one per layer slot, in slot order).
    pub fn new(
        model: &ModelSpec,
        engine: &EngineGeometry,
        num_logical_blocks: u32,
        tensors: &[KvTensor],
        mem: MemKind,
        device: u32,
    ) -> Self {
        let ppl = engine.ppl();
        let num_logical = u64::from(num_logical_blocks);
        let num_kernel = num_logical * u64::from(ppl);
        let kernel_page = engine.kernel_page_bytes(model);
        let kernel_stride = engine.kernel_block_stride(model);
        let replicated = model.is_mla();
        let mut regions: Vec<Region> = Vec::new();
        let mut memory = Vec::new();
        // Regions holding a mamba layer, as vLLM's `_ssm_region_indices`:
        // slot `s` holds one when `s < state_slot_count`.
        let state_slots = model.state_slot_count() as usize;
        let mut state_regions: Vec<usize> = Vec::new();
        for (slot, t) in tensors.iter().enumerate() {
            let holds_state = slot < state_slots;
            memory.push(MemRegion {
                addr: t.base,
                len: t.len,
                mem,
                dev: device,
            });
            if let Some(i) = regions.iter().position(|r| r.base == t.base) {
                regions[i].replicated |= replicated;
                if holds_state && !state_regions.contains(&i) {
                    state_regions.push(i);
                }
                continue;
            }
            if holds_state {
                state_regions.push(regions.len());
            }
            regions.push(Region {
                base: t.base,
                block_len: kernel_page,
                block_stride: kernel_stride,
                num_blocks: num_kernel,
                replicated,
            });
        }
        let (conv_offsets, ssm_sizes, ssm_regions) = match (&model.mamba, model.has_mamba()) {
            (Some(m), true) => (
                m.conv_offsets(engine.tp_size),
                m.ssm_sizes(engine.tp_size),
                state_regions,
            ),
            _ => (Vec::new(), (0, 0), Vec::new()),
        };
        Registration {
            regions,
            ssm_regions,
            kernel_block: engine.kernel_block,
            ppl,
            num_logical_blocks: num_logical,
            num_kernel_blocks: num_kernel,
            conv_offsets,
            ssm_sizes,
            memory,
            mem,
            device,
        }
    }

    /// Number of registered regions.
    pub fn num_regions(&self) -> usize {
        self.regions.len()
    }

    /// Whether any region holds mamba state.
    pub fn has_mamba(&self) -> bool {
        !self.ssm_regions.is_empty()
    }

    /// Local FA descriptors at ratio 1 (`num_descs`).
    pub fn num_descs(&self) -> u64 {
        self.regions.iter().map(|r| r.num_blocks).sum()
    }

    /// Base address of every region, in region order.
    pub fn base_addresses(&self) -> Vec<u64> {
        self.regions.iter().map(|r| r.base).collect()
    }

    /// Bytes of one kernel block, per region.
    pub fn block_lens(&self) -> Vec<u64> {
        self.regions.iter().map(|r| r.block_len).collect()
    }

    /// Bytes between consecutive kernel blocks, per region.
    pub fn block_strides(&self) -> Vec<u64> {
        self.regions.iter().map(|r| r.block_stride).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::fixtures;

    fn tensors(n: u64) -> Vec<KvTensor> {
        (0..n)
            .map(|i| KvTensor {
                base: (i + 1) << 20,
                len: 1 << 16,
            })
            .collect()
    }

    fn register(model: &ModelSpec, slots: u64) -> Registration {
        let g = fixtures::g1();
        Registration::new(model, &g.decode, 8, &tensors(slots), MemKind::Dram, 0)
    }

    #[test]
    fn every_slot_holds_state_by_default() {
        let mut model = fixtures::mla_kda([2, 2, 4], 64);
        model.layer_slots = 3;
        let reg = register(&model, 3);
        assert_eq!(reg.num_regions(), 3);
        assert_eq!(reg.ssm_regions, vec![0, 1, 2]);
    }

    #[test]
    fn only_the_slots_with_a_mamba_layer_hold_state() {
        let mut model = fixtures::mla_kda([2, 2, 4], 64);
        model.layer_slots = 3;
        model.state_slots = Some(2);
        let reg = register(&model, 3);
        assert_eq!(reg.num_regions(), 3);
        assert_eq!(reg.ssm_regions, vec![0, 1]);
        // Attention still covers every region.
        assert_eq!(reg.num_descs(), 3 * reg.num_kernel_blocks);
    }

    #[test]
    fn a_model_without_mamba_has_no_state_regions() {
        let mut model = fixtures::mla_kda([2, 2, 4], 64);
        model.mamba = None;
        model.groups = vec![crate::geometry::GroupKind::Attention];
        let reg = register(&model, 2);
        assert!(reg.ssm_regions.is_empty() && !reg.has_mamba());
    }
}
