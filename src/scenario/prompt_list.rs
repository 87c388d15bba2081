//! Prompt-length lists as a user writes them (`2..=39,41`): on the
//! command line (`--prompts`) and in an expectations file's `cases`.

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
