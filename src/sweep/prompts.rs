//! Prompt-length lists: parsing `2..=39,41` and the default residue sweep.

use crate::geometry::Geometry;

/// A prompt list that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad prompt list `{text}`: {why} (expected e.g. `2..=39,41`)")]
pub struct PromptListError {
    pub text: String,
    pub why: String,
}

/// Parse a comma-separated list of lengths and inclusive (`a..=b`) or
/// half-open (`a..b`) ranges. Lengths must be >= 1.
pub fn parse_prompt_list(text: &str) -> Result<Vec<u32>, PromptListError> {
    let err = |why: String| PromptListError {
        text: text.to_string(),
        why,
    };
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let num = |s: &str| -> Result<u32, PromptListError> {
            s.trim()
                .parse::<u32>()
                .map_err(|_| err(format!("`{s}` is not a prompt length")))
        };
        let (start, end) = if let Some((a, b)) = item.split_once("..=") {
            (num(a)?, num(b)?)
        } else if let Some((a, b)) = item.split_once("..") {
            let b = num(b)?;
            if b == 0 {
                return Err(err(format!("`{item}` is empty")));
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
            return Err(err(format!("`{item}` is empty")));
        }
        if (end - start) as usize + out.len() > 1_000_000 {
            return Err(err("more than a million prompt lengths".into()));
        }
        out.extend(start..=end);
    }
    if out.is_empty() {
        return Err(err("no prompt length".into()));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
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
        assert!(parse_prompt_list("x")
            .unwrap_err()
            .to_string()
            .contains("`x` is not a prompt length"));
        assert!(parse_prompt_list("").is_err());
    }
}
