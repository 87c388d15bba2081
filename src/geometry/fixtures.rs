//! Small models and engines shared by tests, examples and benchmarks, so
//! that a test states only what differs from them.

use super::{AttentionSpec, EngineGeometry, Geometry, GroupKind, MambaKind, MambaSpec, ModelSpec};

/// MLA (12 bytes per token: head 6, 2-byte dtype) and two KDA groups on two
/// layer slots, as in vLLM's own geometry tests (KimiLinear-like).
pub fn mla_kda(conv_dims: [u32; 3], ssm_state_bytes: u64) -> ModelSpec {
    ModelSpec {
        attention: Some(AttentionSpec::Mla {
            head_size: 6,
            dtype_bytes: 2,
        }),
        mamba: Some(MambaSpec {
            kind: MambaKind::Kda,
            conv_dims: conv_dims.to_vec(),
            conv_rows: 3,
            conv_dtype_bytes: 2,
            ssm_state_bytes,
            n_groups: None,
        }),
        groups: vec![GroupKind::Attention, GroupKind::Mamba, GroupKind::Mamba],
        layer_slots: 2,
        state_slots: None,
    }
}

/// G1 of vLLM's tests: [`mla_kda`] with conv dims [2, 2, 4] and a 64-byte
/// state; P TP2 logical 8 / kernel 4 -> D TP1 logical 12 / kernel 4.
pub fn g1() -> Geometry {
    Geometry {
        name: "g1".into(),
        description: "KimiLinear-like MLA + KDA".into(),
        model: mla_kda([2, 2, 4], 64),
        prefill: EngineGeometry::new(2, 4, 8),
        decode: EngineGeometry::new(1, 4, 12),
        prompts: Some((2..=39).collect()),
        expect_rejection: None,
        stack: crate::geometry::Stack::Vllm,
        handshake: crate::geometry::HandshakeCompat::default(),
        sglang: None,
    }
}
