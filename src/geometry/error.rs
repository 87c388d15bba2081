//! Errors from reading and validating geometry files.
//!
//! A [`GeometryError`] always names the file. A broken rule additionally names
//! the field as a dotted path (`decode.kernel_block`, `model.mamba.conv_dims[2]`)
//! and the [`Rule`] with the numbers involved, so that a message reads
//! `geometries/x.toml: decode.kernel_block: kernel block 6 does not divide logical block 16`.

use std::fmt;
use std::path::PathBuf;

use super::model::{GroupKind, MambaKind};

/// Why a geometry file could not be turned into a [`Geometry`](super::Geometry).
#[derive(Debug, thiserror::Error)]
pub enum GeometryError {
    /// The file or folder could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// TOML syntax error, wrong value type, unknown or missing field: toml's
    /// own message, which shows the line and column.
    #[error("{file}: {detail}")]
    Syntax {
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
        file: String,
        /// Dotted path of the offending field, e.g. `decode.kernel_block`.
        field: String,
        rule: Rule,
    },
    /// The file is not a regular file, or is larger than the input limit.
    #[error(transparent)]
    Input(#[from] crate::limits::InputError),
    /// A folder given to `load_geometries` holds no `*.toml` file.
    #[error("{}: no *.toml geometry files in this folder", dir.display())]
    EmptyFolder { dir: PathBuf },
    /// Two loaded files define the same geometry name.
    #[error("{second}: geometry name `{name}` is already used by {first}")]
    DuplicateName {
        name: String,
        first: String,
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
    pub rule: Rule,
}

impl Violation {
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

/// Which engine of the pair a rule is about, as it appears in field paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Engine {
    Prefill,
    Decode,
}

impl Engine {
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
    #[error("must not be empty")]
    Empty,
    /// A file naming `model.hf_config`: what derivation found wrong.
    #[error("{0}")]
    Derived(String),
    #[error("must be one line")]
    MultiLine,
    #[error(
        "`{name}` may only contain ASCII letters, digits, '-', '_' and '.' \
         (the name defaults to the file stem; set `name` to override it)"
    )]
    BadName { name: String },
    #[error("must be at least 1, found {found}")]
    NotPositive { found: i64 },
    #[error("dtype size {found} bytes is not one of 1, 2, 4, 8")]
    DtypeBytes { found: u32 },
    #[error("kernel block {kernel} does not divide logical block {logical}")]
    KernelDoesNotDivideLogical { kernel: u32, logical: u32 },
    #[error("lists no KV-cache group; give at least one of \"attention\", \"mamba\"")]
    NoGroups,
    #[error("group kind \"{}\" needs a [model.{}] table", kind_name(*kind), kind_name(*kind))]
    MissingSpec { kind: GroupKind },
    #[error("[model.{}] is given but no entry of model.groups is \"{}\"", kind_name(*kind), kind_name(*kind))]
    UnusedSpec { kind: GroupKind },
    #[error(
        "a model with mamba groups needs an attention group too: the padded page \
         that holds one mamba state is sized from attention bytes per token"
    )]
    MambaWithoutAttention,
    #[error("kind \"full\" needs total_kv_heads")]
    MissingKvHeads,
    #[error("total_kv_heads only applies to kind \"full\" (MLA has one latent head)")]
    KvHeadsOnMla,
    #[error(
        "mamba kind \"{}\" has {expected} conv sub-projection(s), found {found} conv_dims",
        mamba_kind_name(*kind)
    )]
    ConvDimsCount {
        kind: MambaKind,
        expected: usize,
        found: usize,
    },
    #[error(
        "mamba kind \"{}\" splits its conv state as {}, found {} = {first} and {} = {second}",
        mamba_kind_name(*kind),
        conv_split_name(*kind),
        equal_pair_names(*kind).0,
        equal_pair_names(*kind).1
    )]
    UnequalConvPair {
        kind: MambaKind,
        first: u32,
        second: u32,
    },
    #[error("{value} {what} do not split evenly over {engine}.tp_size = {tp}")]
    NotSplitOverTp {
        value: u64,
        /// What is being split, plural: "conv channels", "SSM state bytes".
        what: &'static str,
        engine: Engine,
        tp: u32,
    },
    #[error(
        "{heads} KV heads can be neither sharded nor replicated evenly over \
         {engine}.tp_size = {tp} (one must be a multiple of the other)"
    )]
    KvHeadsVsTp { heads: u32, engine: Engine, tp: u32 },
    #[error(
        "one rank's page of {bytes} bytes (logical block x attention bytes per token, \
         with every kernel page's padding) exceeds the limit of {limit} bytes"
    )]
    PageTooLarge { bytes: u128, limit: u64 },
    #[error(
        "one rank's mamba state at TP {tp} (conv {conv} + SSM {ssm} = {} bytes) does not fit \
         the padded page of {page} bytes (logical block {logical} x {per_token} attention \
         bytes per token); the logical block must be at least {min_logical} tokens",
        u128::from(*conv) + u128::from(*ssm)
    )]
    MambaStateExceedsPage {
        tp: u32,
        conv: u64,
        ssm: u64,
        page: u64,
        logical: u32,
        per_token: u64,
        /// Smallest multiple of the kernel block whose page holds the state.
        min_logical: u64,
    },
    #[error("`{text}` is not a range: write \"START..=END\" (inclusive), e.g. \"2..=39\"")]
    BadRange { text: String },
    #[error("prompt length {found} is larger than {}", u32::MAX)]
    PromptTooLong { found: i64 },
    #[error("range {start}..={end} is empty")]
    EmptyRange { start: i64, end: i64 },
    #[error("is an empty list; leave `prompts` out to use the default sweep")]
    NoPrompts,
    #[error("prompt length {length} is listed twice")]
    DuplicatePrompt { length: u32 },
    #[error("expands to {count} prompt lengths, more than the limit of {limit}")]
    TooManyPrompts { count: u64, limit: u64 },
    #[error("{found} is above the limit of {limit}")]
    AboveLimit { found: u64, limit: u64 },
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
