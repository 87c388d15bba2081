//! Errors from reading and validating geometry files.
//!
//! A [`GeometryError`] always names the file. A broken rule additionally names
//! the field as a dotted path (`decode.kernel_block`, `model.mamba.conv_dims[2]`)
//! and the [`Rule`] with the numbers involved, so that a message reads
//! `geometries/x.toml: decode.kernel_block: kernel block 6 does not divide logical block 16`.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::model::{GroupKind, MambaKind};

/// Why a geometry file could not be turned into a [`Geometry`](super::Geometry).
#[derive(Debug, thiserror::Error)]
pub enum GeometryError {
    /// The file or folder could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// TOML syntax error, wrong value type, unknown or missing field: toml's
    /// own message, which shows the line and column.
    #[error("{file}: {detail}")]
    Syntax {
        /// The file (or source name) parsed.
        file: String,
        /// 1-based line of the problem, when toml reports a position.
        line: Option<usize>,
        /// 1-based column of the problem, when toml reports a position.
        column: Option<usize>,
        /// toml's full message, with the offending line quoted.
        detail: String,
    },
    /// The file parses but describes an impossible or malformed geometry.
    #[error("{file}: {field}: {rule}")]
    Invalid {
        /// The file (or source name) the geometry came from.
        file: String,
        /// Dotted path of the offending field, e.g. `decode.kernel_block`.
        field: String,
        /// The rule it breaks.
        rule: Rule,
    },
    /// The file is not a regular file, or is larger than the input limit.
    #[error(transparent)]
    Input(#[from] crate::limits::InputError),
    /// A folder given to `load_geometries` holds no `*.toml` file.
    #[error("{}: no *.toml geometry files in this folder", dir.display())]
    EmptyFolder {
        /// The folder.
        dir: PathBuf,
    },
    /// Two loaded files define the same geometry name.
    #[error("{second}: geometry name `{name}` is already used by {first}")]
    DuplicateName {
        /// The geometry name.
        name: String,
        /// The file that used it first.
        first: String,
        /// The file that uses it again.
        second: String,
    },
}

impl GeometryError {
    /// The broken rule, for an [`GeometryError::Invalid`] error.
    pub fn rule(&self) -> Option<&Rule> {
        match self {
            GeometryError::Invalid { rule, .. } => Some(rule),
            _ => None,
        }
    }

    /// The dotted field path, for an [`GeometryError::Invalid`] error.
    pub fn field(&self) -> Option<&str> {
        match self {
            GeometryError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// A broken rule at one field of a geometry, before the file name is known.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct Violation {
    /// Dotted path of the offending field, e.g. `decode.kernel_block`.
    pub field: String,
    /// The rule it breaks.
    pub rule: Rule,
}

impl Violation {
    /// `field` breaks `rule`.
    pub fn new(field: impl Into<String>, rule: Rule) -> Self {
        Violation {
            field: field.into(),
            rule,
        }
    }

    /// Attach the file (or other source) name the geometry came from.
    pub fn in_file(self, file: impl Into<String>) -> GeometryError {
        GeometryError::Invalid {
            file: file.into(),
            field: self.field,
            rule: self.rule,
        }
    }
}

/// An engine of the P/D pair: which one a geometry rule is about, as it
/// appears in field paths, or which one a lifecycle operation acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// The prefill engine (the `[prefill]` table), which computes the
    /// prompt's KV and holds it.
    Prefill,
    /// The decode engine (the `[decode]` table), which reads it and generates.
    Decode,
}

impl Engine {
    /// `prefill` or `decode`, also the table's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Prefill => "prefill",
            Engine::Decode => "decode",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rule a geometry breaks, with the values that break it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rule {
    /// An empty string.
    #[error("must not be empty")]
    Empty,
    /// A file naming `model.hf_config`: what derivation found wrong.
    #[error("{0}")]
    Derived(String),
    /// An `expect_rejection` table that names no mode.
    #[error(
        "names no mode: give `pull`, `push` or both (`{{ push = \"...\" }}`), or one string for both modes"
    )]
    NoRejectedMode,
    /// A string with a line break.
    #[error("must be one line")]
    MultiLine,
    /// A name with characters outside `[A-Za-z0-9._-]`.
    #[error(
        "`{name}` may only contain ASCII letters, digits, '-', '_' and '.' \
         (the name defaults to the file stem; set `name` to override it)"
    )]
    BadName {
        /// The name.
        name: String,
    },
    /// A name not spelled as the stack spells such names.
    #[error("`{found}` is not {expected}")]
    BadSpelling {
        /// The value given.
        found: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A count or size of zero or less.
    #[error("must be at least 1, found {found}")]
    NotPositive {
        /// The value given.
        found: i64,
    },
    /// An element size that is no machine type's.
    #[error("dtype size {found} bytes is not one of 1, 2, 4, 8")]
    DtypeBytes {
        /// The size given, in bytes.
        found: u32,
    },
    /// A V head size given for MLA, which has no separate V.
    #[error("MLA has no separate V: leave v_head_size out")]
    VHeadSizeOnMla,
    /// An attention TP that does not divide the engine's TP.
    #[error("attention TP {attn_tp} does not divide TP {tp} (DP attention runs tp / attn_tp_size replicas)")]
    AttnTpVsTp {
        /// The attention TP given.
        attn_tp: u32,
        /// The engine's TP.
        tp: u32,
    },
    /// A logical block that is not a whole number of kernel blocks.
    #[error("kernel block {kernel} does not divide logical block {logical}")]
    KernelDoesNotDivideLogical {
        /// Kernel block size, in tokens.
        kernel: u32,
        /// Logical block size, in tokens.
        logical: u32,
    },
    /// `model.groups` is empty.
    #[error("lists no KV-cache group; give at least one of \"attention\", \"mamba\"")]
    NoGroups,
    /// A group kind without its `[model.<kind>]` table.
    #[error("group kind \"{}\" needs a [model.{}] table", kind_name(*kind), kind_name(*kind))]
    MissingSpec {
        /// The group kind.
        kind: GroupKind,
    },
    /// A `[model.<kind>]` table no group uses.
    #[error("[model.{}] is given but no entry of model.groups is \"{}\"", kind_name(*kind), kind_name(*kind))]
    UnusedSpec {
        /// The group kind.
        kind: GroupKind,
    },
    /// Mamba groups without an attention group to size their page.
    #[error(
        "a model with mamba groups needs an attention group too: the padded page \
         that holds one mamba state is sized from attention bytes per token"
    )]
    MambaWithoutAttention,
    /// `model.state_slots` on a model without mamba groups.
    #[error("only applies to a model with mamba groups: it counts the layer slots holding a mamba layer")]
    StateSlotsWithoutMamba,
    /// `model.state_slots` above `model.layer_slots`.
    #[error("{found} is more than model.layer_slots ({layer_slots}): it counts the layer slots that hold a mamba layer")]
    StateSlotsAboveLayerSlots {
        /// The value given.
        found: u32,
        /// `model.layer_slots`.
        layer_slots: u32,
    },
    /// Full attention without `total_kv_heads`.
    #[error("kind \"full\" needs total_kv_heads")]
    MissingKvHeads,
    /// `total_kv_heads` on MLA.
    #[error("total_kv_heads only applies to kind \"full\" (MLA has one latent head)")]
    KvHeadsOnMla,
    /// `conv_dims` with the wrong number of entries for the mamba kind.
    #[error(
        "mamba kind \"{}\" has {expected} conv sub-projection(s), found {found} conv_dims",
        mamba_kind_name(*kind)
    )]
    ConvDimsCount {
        /// The mamba kind.
        kind: MambaKind,
        /// Conv sub-projections the kind has.
        expected: usize,
        /// Entries given.
        found: usize,
    },
    /// Two conv dimensions the mamba kind requires equal differ.
    #[error(
        "mamba kind \"{}\" splits its conv state as {}, found {} = {first} and {} = {second}",
        mamba_kind_name(*kind),
        conv_split_name(*kind),
        equal_pair_names(*kind).0,
        equal_pair_names(*kind).1
    )]
    UnequalConvPair {
        /// The mamba kind.
        kind: MambaKind,
        /// The first dimension of the pair.
        first: u32,
        /// The second dimension of the pair.
        second: u32,
    },
    /// A per-rank quantity that is not a multiple of the engine's TP size.
    #[error("{value} {what} do not split evenly over {engine}.tp_size = {tp}")]
    NotSplitOverTp {
        /// The quantity, in the unit `what` names.
        value: u64,
        /// What is being split, plural: "conv channels", "SSM state bytes".
        what: &'static str,
        /// The engine.
        engine: Engine,
        /// Its TP size.
        tp: u32,
    },
    /// `n_groups` on a mamba kind without B/C groups.
    #[error(
        "n_groups only applies to kind \"mamba2\" (its B and C groups), found kind \"{}\"",
        mamba_kind_name(*kind)
    )]
    GroupsNotMamba2 {
        /// The mamba kind.
        kind: MambaKind,
    },
    /// B (and C) channels that are not a whole number of groups.
    #[error("{channels} B channels are not a whole number of {groups} groups")]
    GroupsDoNotSplitChannels {
        /// B channels over all ranks.
        channels: u32,
        /// The model's groups.
        groups: u32,
    },
    /// Mamba2 groups that TP neither divides nor can replicate (vLLM
    /// replicates only a single group).
    #[error(
        "{groups} Mamba2 groups do not split over {engine}.tp_size = {tp}; vLLM replicates \
         groups only when there is one (\"If tensor parallel world size does not divide \
         num_groups, then num_groups must equal 1.\")"
    )]
    GroupsVsTp {
        /// The model's groups.
        groups: u32,
        /// The engine.
        engine: Engine,
        /// Its TP size.
        tp: u32,
    },
    /// KV heads that neither shard nor replicate evenly over TP.
    #[error(
        "{heads} KV heads can be neither sharded nor replicated evenly over \
         {engine}.tp_size = {tp} (one must be a multiple of the other)"
    )]
    KvHeadsVsTp {
        /// The model's KV heads.
        heads: u32,
        /// The engine.
        engine: Engine,
        /// Its TP size.
        tp: u32,
    },
    /// A page too large to allocate.
    #[error(
        "one rank's page of {bytes} bytes (logical block x attention bytes per token, \
         with every kernel page's padding) exceeds the limit of {limit} bytes"
    )]
    PageTooLarge {
        /// One rank's page, in bytes.
        bytes: u128,
        /// The largest page allowed, in bytes.
        limit: u64,
    },
    /// One rank's mamba state does not fit the padded page.
    #[error(
        "one rank's mamba state at TP {tp} (conv {conv} + SSM {ssm} = {} bytes) does not fit \
         the padded page of {page} bytes (logical block {logical} x {per_token} attention \
         bytes per token); the logical block must be at least {min_logical} tokens",
        u128::from(*conv) + u128::from(*ssm)
    )]
    MambaStateExceedsPage {
        /// The engine's TP size.
        tp: u32,
        /// Conv state of one rank, in bytes.
        conv: u64,
        /// SSM state of one rank, in bytes.
        ssm: u64,
        /// The padded page, in bytes.
        page: u64,
        /// The logical block, in tokens.
        logical: u32,
        /// Attention bytes per token of one rank.
        per_token: u64,
        /// Smallest multiple of the kernel block whose page holds the state.
        min_logical: u64,
    },
    /// A prompt range that does not parse.
    #[error("`{text}` is not a range: write \"START..=END\" (inclusive), e.g. \"2..=39\"")]
    BadRange {
        /// The text given.
        text: String,
    },
    /// A prompt length beyond `u32`.
    #[error("prompt length {found} is larger than {}", u32::MAX)]
    PromptTooLong {
        /// The length given, in tokens.
        found: i64,
    },
    /// A range whose end precedes its start.
    #[error("range {start}..={end} is empty")]
    EmptyRange {
        /// First prompt length of the range.
        start: i64,
        /// Last prompt length of the range (inclusive).
        end: i64,
    },
    /// `prompts = []`.
    #[error("is an empty list; leave `prompts` out to use the default sweep")]
    NoPrompts,
    /// A prompt length given twice.
    #[error("prompt length {length} is listed twice")]
    DuplicatePrompt {
        /// The length, in tokens.
        length: u32,
    },
    /// A prompt list too long to sweep.
    #[error("expands to {count} prompt lengths, more than the limit of {limit}")]
    TooManyPrompts {
        /// Prompt lengths the list expands to.
        count: u64,
        /// The most allowed.
        limit: u64,
    },
    /// A count or size above its limit (`crate::limits`).
    #[error("{found} is above the limit of {limit}")]
    AboveLimit {
        /// The value given.
        found: u64,
        /// The most allowed.
        limit: u64,
    },
}

fn kind_name(kind: GroupKind) -> &'static str {
    match kind {
        GroupKind::Attention => "attention",
        GroupKind::Mamba => "mamba",
    }
}

pub(crate) fn mamba_kind_name(kind: MambaKind) -> &'static str {
    match kind {
        MambaKind::Mamba1 => "mamba1",
        MambaKind::Mamba2 => "mamba2",
        MambaKind::Gdn => "gdn",
        MambaKind::Kda => "kda",
    }
}

/// Names of the two conv sub-projections that must be equal (mamba2: B, C; gdn: Q, K).
pub(crate) fn equal_pair_names(kind: MambaKind) -> (&'static str, &'static str) {
    match kind {
        MambaKind::Mamba2 => ("B", "C"),
        _ => ("Q", "K"),
    }
}

fn conv_split_name(kind: MambaKind) -> &'static str {
    match kind {
        MambaKind::Mamba1 => "one projection",
        MambaKind::Mamba2 => "x | B | C with B = C",
        MambaKind::Gdn => "Q | K | V with Q = K",
        MambaKind::Kda => "Q | K | V",
    }
}
