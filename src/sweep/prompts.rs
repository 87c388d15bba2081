//! Prompt-length lists: parsing `2..=39,41` and the default residue sweep.

use crate::geometry::Geometry;
use crate::limits::{MAX_PROMPTS, MAX_PROMPT_LEN};

/// A prompt list that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}`: {why} (expected e.g. `2..=39,41`)")]
pub struct PromptListError {
    pub text: String,
    pub why: String,
}

/// Parse a comma-separated list of lengths and inclusive (`a..=b`) or
/// half-open (`a..b`) ranges. Lengths must be >= 1. The error names the
/// list, and the item at fault when the list has more than one.
pub fn parse_prompt_list(text: &str) -> Result<Vec<u32>, PromptListError> {
    let err = |why: String| PromptListError {
        text: text.to_string(),
        why,
    };
    let whole = text.trim();
    // "`what` is `rule`", or the rule alone when `what` is the whole list
    // (which the message names already).
    let subject = |what: &str, rule: &str| {
        if what == whole {
            rule.to_string()
        } else {
            format!("`{what}` is {rule}")
        }
    };
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let num = |s: &str| -> Result<u32, PromptListError> {
            let s = s.trim();
            s.parse::<u32>()
                .map_err(|_| err(subject(s, "not a prompt length")))
        };
        let (start, end) = if let Some((a, b)) = item.split_once("..=") {
            (num(a)?, num(b)?)
        } else if let Some((a, b)) = item.split_once("..") {
            let b = num(b)?;
            if b == 0 {
                return Err(err(subject(item, "an empty range")));
            }
            (num(a)?, b - 1)
        } else {
            let n = num(item)?;
            (n, n)
        };
        if start == 0 {
            return Err(err("prompt lengths start at 1".into()));
        }
        if end < start {
            return Err(err(subject(item, "an empty range")));
        }
        if end > MAX_PROMPT_LEN {
            let what = if end.to_string() == whole {
                String::new()
            } else {
                format!("prompt length {end} is ")
            };
            return Err(err(format!(
                "{what}above the limit of {MAX_PROMPT_LEN} tokens"
            )));
        }
        let count = u64::from(end - start) + 1 + out.len() as u64;
        if count > MAX_PROMPTS {
            return Err(err(format!(
                "more than the limit of {MAX_PROMPTS} prompt lengths"
            )));
        }
        out.extend(start..=end);
    }
    if out.is_empty() {
        return Err(err("no prompt length".into()));
    }
    out.sort_unstable();
    // As in a geometry file: a length listed twice is a mistake, not a request.
    if let Some(w) = out.windows(2).find(|w| w[0] == w[1]) {
        return Err(err(format!("prompt length {} is listed twice", w[0])));
    }
    Ok(out)
}

/// How many lengths the default sweep of `geometry` runs.
pub fn default_prompt_count(geometry: &Geometry) -> u64 {
    let (p, d) = (&geometry.prefill, &geometry.decode);
    u64::from(p.logical_block.max(d.logical_block))
        + u64::from(p.kernel_block.max(d.kernel_block))
        + 1
}

/// A geometry without a prompt list whose default sweep is too long.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{file}: without a `prompts` list the default sweep runs every length from 1 to {count} \
     (one past the largest logical plus kernel block), more than the limit of {limit} prompt \
     lengths; list the lengths to run in `prompts` or give --prompts"
)]
pub struct DefaultSweepTooLong {
    pub file: String,
    pub count: u64,
    pub limit: u64,
}

/// Refuse a geometry whose default sweep would exceed the prompt limit,
/// unless explicit lengths replace it.
pub fn check_default_sweep(
    file: &str,
    geometry: &Geometry,
    explicit: bool,
) -> Result<(), DefaultSweepTooLong> {
    let count = default_prompt_count(geometry);
    if explicit || geometry.prompts.is_some() || count <= MAX_PROMPTS {
        return Ok(());
    }
    Err(DefaultSweepTooLong {
        file: file.to_string(),
        count,
        limit: MAX_PROMPTS,
    })
}

/// The default sweep: every N from 1 up to one past the largest logical
/// block plus the largest kernel block, which covers every residue of every
/// block size of the pair and crosses a block boundary of each.
pub fn default_prompts(geometry: &Geometry) -> Vec<u32> {
    let (p, d) = (&geometry.prefill, &geometry.decode);
    let bound = p.logical_block.max(d.logical_block) + p.kernel_block.max(d.kernel_block) + 1;
    (1..=bound).collect()
}

/// The prompt lengths to run for `geometry`: an explicit list, the file's
/// own list, or the default sweep.
pub fn prompts_for(geometry: &Geometry, explicit: Option<&[u32]>) -> Vec<u32> {
    match (explicit, &geometry.prompts) {
        (Some(list), _) => list.to_vec(),
        (None, Some(list)) => list.clone(),
        (None, None) => default_prompts(geometry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_lengths() {
        assert_eq!(
            parse_prompt_list("2..=5,9, 7..8").unwrap(),
            vec![2, 3, 4, 5, 7, 9]
        );
        assert!(parse_prompt_list("0..=3").is_err());
        assert!(parse_prompt_list("5..=2").is_err());
        // The item at fault is named when the list has others.
        assert_eq!(
            parse_prompt_list("x").unwrap_err().to_string(),
            "`x`: not a prompt length (expected e.g. `2..=39,41`)"
        );
        assert!(parse_prompt_list("2, x..=4")
            .unwrap_err()
            .to_string()
            .starts_with("`2, x..=4`: `x` is not a prompt length"));
        assert!(parse_prompt_list("2000000")
            .unwrap_err()
            .to_string()
            .starts_with("`2000000`: above the limit of 1048576 tokens"));
        assert!(parse_prompt_list("").is_err());
        assert!(parse_prompt_list("3,3")
            .unwrap_err()
            .to_string()
            .contains("prompt length 3 is listed twice"));
        assert!(parse_prompt_list("1..=4294967295")
            .unwrap_err()
            .to_string()
            .contains("above the limit"));
        assert!(parse_prompt_list("1..=200000")
            .unwrap_err()
            .to_string()
            .contains("more than the limit of 100000 prompt lengths"));
    }
}
