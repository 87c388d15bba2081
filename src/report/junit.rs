//! The JUnit XML sweep report (docs/report-format.md): written from a
//! sweep's cases, and read back by `kvgeom report merge`, which writes the
//! shards' cases again with the same writer, so a merged report is the
//! report of one run.
//!
//! A shard's report (`--shard K/N`) carries the shard, the sweep's total
//! case count and its fingerprint as `<properties>` of `<testsuites>`, and
//! each case's position in the whole sweep as a `kvgeom.index` property of
//! its `<testcase>`.

use std::collections::HashMap;
use std::fmt::Write;
use std::num::ParseIntError;

use quick_xml::encoding::EncodingError;
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::attributes::AttrError;
use quick_xml::events::{BytesStart, Event};
use quick_xml::{Reader, XmlVersion};

use crate::sweep::shard::{parse_shard, Shard, ShardError};
use crate::under_test::CodeUnderTest;

/// The `name` of the root `<testsuites>` of every kvgeom report.
pub const ROOT_NAME: &str = "kvgeom";
/// `<testsuites>` property: the shard, `K/N`.
pub const SHARD_PROPERTY: &str = "kvgeom.shard";
/// `<testsuites>` property: the cases of every shard.
pub const TOTAL_PROPERTY: &str = "kvgeom.total_cases";
/// `<testsuites>` property: the fingerprint of the sweep's inputs and options.
pub const FINGERPRINT_PROPERTY: &str = "kvgeom.fingerprint";
/// `<testcase>` property: the case's position in the whole sweep (0-based).
pub const INDEX_PROPERTY: &str = "kvgeom.index";
/// `<testsuites>` properties naming the code under test start with this
/// (`kvgeom.code_under_test.connector`, `.version`, `.policy`, `.source`).
pub const CODE_PROPERTY_PREFIX: &str = "kvgeom.code_under_test.";

/// The `<testsuites>` properties of the code under test, in the order
/// written: connector, version, then policy and source where given (source
/// as `PATH@COMMIT`, `+dirty` when it has local changes).
pub fn code_properties(code: &CodeUnderTest) -> Vec<(String, String)> {
    let name = |field: &str| format!("{CODE_PROPERTY_PREFIX}{field}");
    let mut out = vec![
        (name("connector"), code.connector.name().to_string()),
        (name("version"), code.version.clone()),
    ];
    if let Some(policy) = &code.policy {
        out.push((name("policy"), policy.clone()));
    }
    if let Some(source) = &code.source {
        let dirty = if source.dirty { "+dirty" } else { "" };
        out.push((
            name("source"),
            format!("{}@{}{dirty}", source.path, source.commit),
        ));
    }
    if !code.modified_files.is_empty() {
        out.push((name("modified_files"), code.modified_files.join(" ")));
    }
    if let Some(torch) = &code.torch {
        out.push((name("torch"), torch.clone()));
    }
    if !code.substitutions.is_empty() {
        out.push((name("substitutions"), code.substitutions.join("; ")));
    }
    out
}

/// One `<testcase>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JunitCase {
    /// Its `<testsuite>` (and `classname`): the geometry's name.
    pub suite: String,
    /// The case, e.g. `N=25 h=0 pull mainline`.
    pub name: String,
    /// The `<failure>` of a failing case.
    pub failure: Option<JunitFailure>,
}

/// A failing case's `<failure>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JunitFailure {
    /// The `message` attribute: the outcome.
    pub message: String,
    /// The element's text: the outcome, the replay command, the violations.
    pub text: String,
}

/// A character XML 1.0 cannot hold, even as a reference.
fn unrepresentable(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{fffe}' | '\u{ffff}')
}

/// Escape `s` for an attribute value (`attribute`) or element text. Line
/// breaks and tabs in attributes, and carriage returns anywhere, become
/// character references (a parser would normalize them otherwise); a
/// character XML cannot hold becomes U+FFFD.
fn escape(s: &str, attribute: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\r' => out.push_str("&#13;"),
            '\n' if attribute => out.push_str("&#10;"),
            '\t' if attribute => out.push_str("&#9;"),
            c if unrepresentable(c) => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

fn property(out: &mut String, indent: &str, name: &str, value: &str) {
    let _ = writeln!(
        out,
        "{indent}<property name=\"{}\" value=\"{}\"/>",
        escape(name, true),
        escape(value, true)
    );
}

/// The report of `cases` in sweep order: one `<testsuite>` per suite, in the
/// order of its first case, and one `<testcase>` per case. With `shard`,
/// the shard's properties and each case's position (`positions[i]` for
/// `cases[i]`); then the code under test's properties (`code`, as
/// [`code_properties`] gives them).
pub fn write(
    cases: &[JunitCase],
    shard: Option<(&Shard, &[usize])>,
    code: &[(String, String)],
) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let failed = cases.iter().filter(|c| c.failure.is_some()).count();
    let _ = writeln!(
        out,
        "<testsuites name=\"{ROOT_NAME}\" tests=\"{}\" failures=\"{failed}\">",
        cases.len()
    );
    let mut props: Vec<(String, String)> = Vec::new();
    if let Some((s, _)) = shard {
        props.extend([
            (SHARD_PROPERTY.into(), format!("{}/{}", s.index, s.count)),
            (TOTAL_PROPERTY.into(), s.total_cases.to_string()),
            (FINGERPRINT_PROPERTY.into(), s.fingerprint.clone()),
        ]);
    }
    props.extend(code.iter().cloned());
    if !props.is_empty() {
        out.push_str("  <properties>\n");
        for (name, value) in &props {
            property(&mut out, "    ", name, value);
        }
        out.push_str("  </properties>\n");
    }
    let mut order: Vec<&str> = Vec::new();
    let mut members: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, c) in cases.iter().enumerate() {
        members
            .entry(c.suite.as_str())
            .or_insert_with(|| {
                order.push(c.suite.as_str());
                Vec::new()
            })
            .push(i);
    }
    for suite in order {
        let mine = &members[suite];
        let failed = mine.iter().filter(|&&i| cases[i].failure.is_some()).count();
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\">",
            escape(suite, true),
            mine.len()
        );
        for &i in mine {
            let c = &cases[i];
            let index = shard.and_then(|(_, positions)| positions.get(i));
            let _ = write!(
                out,
                "    <testcase classname=\"{}\" name=\"{}\"",
                escape(suite, true),
                escape(&c.name, true)
            );
            if index.is_none() && c.failure.is_none() {
                out.push_str("/>\n");
                continue;
            }
            out.push_str(">\n");
            if let Some(index) = index {
                out.push_str("      <properties>\n");
                property(&mut out, "        ", INDEX_PROPERTY, &index.to_string());
                out.push_str("      </properties>\n");
            }
            if let Some(f) = &c.failure {
                let _ = writeln!(
                    out,
                    "      <failure message=\"{}\">{}</failure>",
                    escape(&f.message, true),
                    escape(&f.text, false)
                );
            }
            out.push_str("    </testcase>\n");
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

/// A JUnit report as read back.
#[derive(Debug)]
pub struct ReadReport {
    /// The shard's properties; `None` for a report written without `--shard`.
    pub shard: Option<Shard>,
    /// The code under test's properties ([`CODE_PROPERTY_PREFIX`]), in
    /// document order.
    pub code: Vec<(String, String)>,
    /// Every case in document order, with its `kvgeom.index` where given.
    pub cases: Vec<(Option<u64>, JunitCase)>,
}

/// Why a document is not a kvgeom JUnit report. The message says what is
/// wrong, and where (the byte offset) for malformed XML and for a problem
/// with one element, text or reference, without the file's name.
#[derive(Debug, thiserror::Error)]
pub enum JunitReadError {
    /// The document is not well-formed XML.
    #[error("malformed XML at byte {offset}: {source}")]
    Malformed {
        /// Where the parser stopped.
        offset: u64,
        /// The parser's error.
        #[source]
        source: quick_xml::Error,
    },
    /// An element, text or reference a kvgeom report cannot hold.
    #[error("at byte {offset}: {problem}")]
    At {
        /// Where the offending element, text or reference starts.
        offset: u64,
        /// What is wrong with it.
        #[source]
        problem: JunitEventError,
    },
    /// The document has no root, or ends inside an element.
    #[error("the document ends before </testsuites>")]
    Unfinished,
    /// The counts of `<testsuites>` are not those of its testcases.
    #[error(
        "<testsuites> says tests=\"{tests}\" failures=\"{failures}\" but holds {testcases} \
         testcases, {failing} failing"
    )]
    Counts {
        /// Its `tests` attribute.
        tests: u64,
        /// Its `failures` attribute.
        failures: u64,
        /// The testcases it holds.
        testcases: u64,
        /// Those of them with a `<failure>`.
        failing: u64,
    },
    /// The `kvgeom.shard` property is not `K/N`.
    #[error("property {SHARD_PROPERTY}: {source}")]
    BadShard {
        /// Why the value is no shard.
        #[source]
        source: ShardError,
    },
    /// A property every shard's report has, absent with `kvgeom.shard`.
    #[error("property {property} is missing ({SHARD_PROPERTY} is given)")]
    MissingProperty {
        /// The absent property.
        property: &'static str,
    },
    /// The `kvgeom.total_cases` property is not a count.
    #[error("property {TOTAL_PROPERTY} = `{value}`: not a count of cases")]
    BadTotal {
        /// The value as given.
        value: String,
        /// Why it does not parse.
        #[source]
        source: ParseIntError,
    },
}

/// What is wrong with one element, text or reference of a document, as
/// [`JunitReadError::At`] carries it with its byte offset.
#[derive(Debug, thiserror::Error)]
pub enum JunitEventError {
    /// An attribute that does not parse.
    #[error("{source}")]
    Attribute {
        /// The parser's error.
        #[source]
        source: AttrError,
    },
    /// An attribute whose value does not unescape.
    #[error("attribute `{attribute}`: {source}")]
    AttributeValue {
        /// The attribute.
        attribute: &'static str,
        /// The parser's error.
        #[source]
        source: quick_xml::Error,
    },
    /// An element without an attribute a kvgeom report gives it.
    #[error("<{element}> has no `{attribute}` attribute")]
    MissingAttribute {
        /// The element.
        element: &'static str,
        /// The absent attribute.
        attribute: &'static str,
    },
    /// A `tests` or `failures` attribute that is not a count.
    #[error("<{element} {attribute}=\"{value}\">: not a count")]
    NotACount {
        /// The element.
        element: &'static str,
        /// The attribute.
        attribute: &'static str,
        /// Its value as given.
        value: String,
        /// Why it does not parse.
        #[source]
        source: ParseIntError,
    },
    /// A root `<testsuites>` of another tool.
    #[error(
        "the root is <testsuites name=\"{name}\">; a kvgeom report's is \
         <testsuites name=\"{ROOT_NAME}\">"
    )]
    WrongRootName {
        /// Its `name` attribute; empty when it has none.
        name: String,
    },
    /// A root element other than `<testsuites>`, or a second root.
    #[error("the root element is <{element}>; a kvgeom report's is <testsuites>")]
    WrongRoot {
        /// The element.
        element: String,
    },
    /// A `<testcase>` whose `classname` is not its suite's name.
    #[error(
        "<testcase classname=\"{classname}\"> in <testsuite name=\"{suite}\">: \
         a kvgeom report's classname is its suite's name"
    )]
    Classname {
        /// The testcase's `classname`.
        classname: String,
        /// The suite's `name`.
        suite: String,
    },
    /// A `<testcase>` with a second `<failure>`.
    #[error("testcase `{case}` has two <failure>s")]
    TwoFailures {
        /// The testcase's `name`.
        case: String,
    },
    /// A `kvgeom.index` property that is not a case index.
    #[error("property {INDEX_PROPERTY} = `{value}`: not a case index")]
    BadIndex {
        /// The value as given.
        value: String,
        /// Why it does not parse.
        #[source]
        source: ParseIntError,
    },
    /// A `<testcase>` with a second `kvgeom.index` property.
    #[error("a testcase has two {INDEX_PROPERTY} properties")]
    TwoIndices,
    /// An element a kvgeom report has not there.
    #[error("<{element}> inside <{parent}>: a kvgeom report has no such element there")]
    UnexpectedElement {
        /// The element.
        element: String,
        /// The element it is in.
        parent: &'static str,
    },
    /// Text outside `<failure>`.
    #[error("text `{text}` inside <{parent}>: a kvgeom report has text only in <failure>")]
    UnexpectedText {
        /// The text, trimmed, up to its first 40 characters.
        text: String,
        /// The element it is in, or `the document`.
        parent: &'static str,
    },
    /// A `<testsuite>` whose counts are not those of its testcases.
    #[error(
        "<testsuite name=\"{suite}\"> says tests=\"{tests}\" failures=\"{failures}\" but \
         holds {testcases} testcases, {failing} failing"
    )]
    SuiteCounts {
        /// The suite's `name`.
        suite: String,
        /// Its `tests` attribute.
        tests: u64,
        /// Its `failures` attribute.
        failures: u64,
        /// The testcases it holds.
        testcases: u64,
        /// Those of them with a `<failure>`.
        failing: u64,
    },
    /// Text or a reference that does not decode.
    #[error("{source}")]
    Encoding {
        /// The decoder's error.
        #[source]
        source: EncodingError,
    },
    /// A reference to an entity XML does not predefine.
    #[error("unknown entity `&{name};`")]
    UnknownEntity {
        /// The entity's name.
        name: String,
    },
    /// A character reference that is no character.
    #[error("`&{name};`: {source}")]
    BadReference {
        /// The reference, without `&` and `;`.
        name: String,
        /// The parser's error.
        #[source]
        source: quick_xml::Error,
    },
}

/// Where the reader is in the document.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Root,
    RootProperties,
    Suite,
    Case,
    CaseProperties,
    Failure,
}

impl Place {
    fn element(self) -> &'static str {
        match self {
            Place::Root => "testsuites",
            Place::RootProperties | Place::CaseProperties => "properties",
            Place::Suite => "testsuite",
            Place::Case => "testcase",
            Place::Failure => "failure",
        }
    }
}

struct Parser {
    stack: Vec<Place>,
    root_seen: bool,
    declared: Option<(u64, u64)>,
    root_properties: Vec<(String, String)>,
    suite: Option<String>,
    suite_declared: (u64, u64),
    suite_counted: (u64, u64),
    case: Option<(Option<u64>, JunitCase)>,
    cases: Vec<(Option<u64>, JunitCase)>,
}

fn attr(e: &BytesStart, name: &'static str) -> Result<Option<String>, JunitEventError> {
    for a in e.attributes() {
        let a = a.map_err(|source| JunitEventError::Attribute { source })?;
        if a.key.as_ref() == name.as_bytes() {
            let value = a
                .normalized_value(XmlVersion::Implicit1_0)
                .map_err(|source| JunitEventError::AttributeValue {
                    attribute: name,
                    source,
                })?;
            return Ok(Some(value.into_owned()));
        }
    }
    Ok(None)
}

fn required(
    e: &BytesStart,
    element: &'static str,
    name: &'static str,
) -> Result<String, JunitEventError> {
    attr(e, name)?.ok_or(JunitEventError::MissingAttribute {
        element,
        attribute: name,
    })
}

fn count(
    e: &BytesStart,
    element: &'static str,
    name: &'static str,
) -> Result<u64, JunitEventError> {
    let value = required(e, element, name)?;
    value.parse().map_err(|source| JunitEventError::NotACount {
        element,
        attribute: name,
        value,
        source,
    })
}

impl Parser {
    fn open(&mut self, e: &BytesStart, empty: bool) -> Result<(), JunitEventError> {
        let name = String::from_utf8_lossy(e.name().as_ref()).into_owned();
        let here = self.stack.last().copied();
        let place = match (here, name.as_str()) {
            (None, "testsuites") if !self.root_seen => {
                self.root_seen = true;
                let root = attr(e, "name")?.unwrap_or_default();
                if root != ROOT_NAME {
                    return Err(JunitEventError::WrongRootName { name: root });
                }
                self.declared = Some((
                    count(e, "testsuites", "tests")?,
                    count(e, "testsuites", "failures")?,
                ));
                Place::Root
            }
            (None, _) => return Err(JunitEventError::WrongRoot { element: name }),
            (Some(Place::Root), "properties") => Place::RootProperties,
            (Some(Place::Root), "testsuite") => {
                self.suite = Some(required(e, "testsuite", "name")?);
                self.suite_declared = (
                    count(e, "testsuite", "tests")?,
                    count(e, "testsuite", "failures")?,
                );
                self.suite_counted = (0, 0);
                Place::Suite
            }
            (Some(Place::Suite), "testcase") => {
                let suite = self.suite.clone().unwrap_or_default();
                let classname = required(e, "testcase", "classname")?;
                if classname != suite {
                    return Err(JunitEventError::Classname { classname, suite });
                }
                let case = JunitCase {
                    suite,
                    name: required(e, "testcase", "name")?,
                    failure: None,
                };
                self.case = Some((None, case));
                Place::Case
            }
            (Some(Place::Case), "properties") => Place::CaseProperties,
            (Some(Place::Case), "failure") => {
                let message = required(e, "failure", "message")?;
                if let Some((_, case)) = &mut self.case {
                    if case.failure.is_some() {
                        return Err(JunitEventError::TwoFailures {
                            case: case.name.clone(),
                        });
                    }
                    case.failure = Some(JunitFailure {
                        message,
                        text: String::new(),
                    });
                }
                Place::Failure
            }
            (Some(Place::RootProperties | Place::CaseProperties), "property") if empty => {
                let name = required(e, "property", "name")?;
                let value = required(e, "property", "value")?;
                if here == Some(Place::RootProperties) {
                    self.root_properties.push((name, value));
                } else if name == INDEX_PROPERTY {
                    let index = match value.parse() {
                        Ok(index) => index,
                        Err(source) => return Err(JunitEventError::BadIndex { value, source }),
                    };
                    if let Some((slot @ None, _)) = &mut self.case {
                        *slot = Some(index);
                    } else {
                        return Err(JunitEventError::TwoIndices);
                    }
                }
                return Ok(());
            }
            (Some(here), _) => {
                return Err(JunitEventError::UnexpectedElement {
                    element: name,
                    parent: here.element(),
                })
            }
        };
        self.stack.push(place);
        if empty {
            self.close()?;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), JunitEventError> {
        match self.stack.pop() {
            Some(Place::Case) => {
                if let Some(case) = self.case.take() {
                    self.suite_counted.0 += 1;
                    self.suite_counted.1 += u64::from(case.1.failure.is_some());
                    self.cases.push(case);
                }
            }
            Some(Place::Suite) => {
                let suite = self.suite.take().unwrap_or_default();
                if self.suite_counted != self.suite_declared {
                    return Err(JunitEventError::SuiteCounts {
                        suite,
                        tests: self.suite_declared.0,
                        failures: self.suite_declared.1,
                        testcases: self.suite_counted.0,
                        failing: self.suite_counted.1,
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn text(&mut self, text: &str) -> Result<(), JunitEventError> {
        if self.stack.last() == Some(&Place::Failure) {
            if let Some((
                _,
                JunitCase {
                    failure: Some(f), ..
                },
            )) = &mut self.case
            {
                f.text.push_str(text);
            }
            return Ok(());
        }
        if text.trim().is_empty() {
            return Ok(());
        }
        Err(JunitEventError::UnexpectedText {
            text: text.trim().chars().take(40).collect(),
            parent: self.stack.last().map_or("the document", |p| p.element()),
        })
    }

    fn shard(&self) -> Result<Option<Shard>, JunitReadError> {
        let get = |name: &str| {
            self.root_properties
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let Some(shard) = get(SHARD_PROPERTY) else {
            return Ok(None);
        };
        let (index, count) =
            parse_shard(&shard).map_err(|source| JunitReadError::BadShard { source })?;
        let missing = |property| JunitReadError::MissingProperty { property };
        let total = get(TOTAL_PROPERTY).ok_or_else(|| missing(TOTAL_PROPERTY))?;
        let total_cases = match total.parse() {
            Ok(total_cases) => total_cases,
            Err(source) => {
                return Err(JunitReadError::BadTotal {
                    value: total,
                    source,
                })
            }
        };
        let fingerprint = get(FINGERPRINT_PROPERTY).ok_or_else(|| missing(FINGERPRINT_PROPERTY))?;
        Ok(Some(Shard {
            index,
            count,
            total_cases,
            fingerprint,
        }))
    }
}

/// Read a kvgeom JUnit report. The error says what is wrong, and where
/// (the byte offset) for malformed XML, without the file's name.
pub fn read(text: &str) -> Result<ReadReport, JunitReadError> {
    let mut reader = Reader::from_str(text);
    let mut p = Parser {
        stack: Vec::new(),
        root_seen: false,
        declared: None,
        root_properties: Vec::new(),
        suite: None,
        suite_declared: (0, 0),
        suite_counted: (0, 0),
        case: None,
        cases: Vec::new(),
    };
    loop {
        let at = reader.buffer_position();
        let event = reader
            .read_event()
            .map_err(|source| JunitReadError::Malformed {
                offset: reader.error_position(),
                source,
            })?;
        let encoding = |source| JunitEventError::Encoding { source };
        let step = match event {
            Event::Start(e) => p.open(&e, false),
            Event::Empty(e) => p.open(&e, true),
            Event::End(_) => p.close(),
            Event::Text(t) => match t.xml10_content() {
                Ok(s) => p.text(&s),
                Err(source) => Err(encoding(source)),
            },
            Event::CData(t) => match t.decode() {
                Ok(s) => p.text(&s),
                Err(source) => Err(encoding(source)),
            },
            Event::GeneralRef(r) => match r.decode() {
                Err(source) => Err(encoding(source)),
                Ok(name) => match r.resolve_char_ref() {
                    Ok(Some(c)) => p.text(&c.to_string()),
                    Ok(None) => match resolve_predefined_entity(&name) {
                        Some(s) => p.text(s),
                        None => Err(JunitEventError::UnknownEntity {
                            name: name.into_owned(),
                        }),
                    },
                    Err(source) => Err(JunitEventError::BadReference {
                        name: name.into_owned(),
                        source,
                    }),
                },
            },
            Event::Decl(_) | Event::Comment(_) | Event::PI(_) | Event::DocType(_) => Ok(()),
            Event::Eof => break,
        };
        step.map_err(|problem| JunitReadError::At {
            offset: at,
            problem,
        })?;
    }
    if !p.root_seen || !p.stack.is_empty() {
        return Err(JunitReadError::Unfinished);
    }
    let failing = p.cases.iter().filter(|(_, c)| c.failure.is_some()).count() as u64;
    let testcases = p.cases.len() as u64;
    if let Some((tests, failures)) = p.declared {
        if (tests, failures) != (testcases, failing) {
            return Err(JunitReadError::Counts {
                tests,
                failures,
                testcases,
                failing,
            });
        }
    }
    let code = p
        .root_properties
        .iter()
        .filter(|(name, _)| name.starts_with(CODE_PROPERTY_PREFIX))
        .cloned()
        .collect();
    Ok(ReadReport {
        shard: p.shard()?,
        code,
        cases: p.cases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(suite: &str, name: &str, failure: Option<(&str, &str)>) -> JunitCase {
        JunitCase {
            suite: suite.into(),
            name: name.into(),
            failure: failure.map(|(m, t)| JunitFailure {
                message: m.into(),
                text: t.into(),
            }),
        }
    }

    #[test]
    fn what_is_written_reads_back_unchanged() {
        let cases = vec![
            case("a", "N=1 h=0 pull mainline", None),
            case(
                "b&<\"x\">",
                "N=2 h=0 push mainline",
                Some((
                    "two\nlines\tand \r & <tags> \u{1}",
                    "body\r\nwith ]]> and \"quotes\"\n",
                )),
            ),
            case("a", "N=3 h=0 pull mainline", None),
        ];
        let shard = Shard {
            index: 2,
            count: 3,
            total_cases: 9,
            fingerprint: "00ff".into(),
        };
        let positions = [1, 4, 7];
        let code = code_properties(&CodeUnderTest {
            source: Some(crate::under_test::SourceTree {
                path: "vllm".into(),
                commit: "abc".into(),
                dirty: true,
            }),
            ..CodeUnderTest::vllm("0.33.0")
        });
        let text = write(&cases, Some((&shard, &positions)), &code);
        let back = read(&text).unwrap();
        assert_eq!(back.shard, Some(shard));
        assert_eq!(back.code, code);
        let named: Vec<(&str, &str)> = code.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(
            named,
            [
                ("kvgeom.code_under_test.connector", "vllm"),
                ("kvgeom.code_under_test.version", "0.33.0"),
                ("kvgeom.code_under_test.policy", "vllm-0.33.0"),
                ("kvgeom.code_under_test.source", "vllm@abc+dirty"),
            ]
        );
        let indices: Vec<Option<u64>> = back.cases.iter().map(|(i, _)| *i).collect();
        // Suites group their cases: a's two, then b's.
        assert_eq!(indices, [Some(1), Some(7), Some(4)]);
        let mut expected = cases.clone();
        expected.swap(1, 2);
        // The character XML cannot hold comes back as U+FFFD.
        if let Some(f) = &mut expected[2].failure {
            f.message = f.message.replace('\u{1}', "\u{fffd}");
        }
        let read_cases: Vec<JunitCase> = back.cases.into_iter().map(|(_, c)| c).collect();
        assert_eq!(read_cases, expected);
        let plain = read(&write(&cases, None, &[])).unwrap();
        assert!(plain.shard.is_none());
        assert!(plain.code.is_empty());
        assert!(plain.cases.iter().all(|(i, _)| i.is_none()));
    }

    #[test]
    fn foreign_or_inconsistent_documents_are_refused() {
        let refused = |text: &str, needle: &str| {
            let e = read(text).unwrap_err().to_string();
            assert!(e.contains(needle), "`{needle}` not in `{e}`");
        };
        refused(
            "<testsuites name=\"pytest\" tests=\"0\" failures=\"0\"/>",
            "name=\"pytest\"",
        );
        refused("<report/>", "root element is <report>");
        refused(
            "<testsuites name=\"kvgeom\" tests=\"1\" failures=\"0\"></testsuites>",
            "tests=\"1\" failures=\"0\" but holds 0 testcases",
        );
        refused(
            "<testsuites name=\"kvgeom\" tests=\"0\" failures=\"0\"><x/></testsuites>",
            "<x> inside <testsuites>",
        );
        refused(
            "<testsuites name=\"kvgeom\" tests=\"0\" failures=\"0\">",
            "ends before </testsuites>",
        );
        refused(
            "<testsuites name=\"kvgeom\" tests=\"0\" failures=\"0\"></testsuite>",
            "malformed XML",
        );
        refused(
            "<testsuites name=\"kvgeom\" tests=\"0\" failures=\"0\"><properties>\
             <property name=\"kvgeom.shard\" value=\"5/4\"/></properties></testsuites>",
            "property kvgeom.shard: `5/4`",
        );
        refused(
            "<testsuites name=\"kvgeom\" tests=\"0\" failures=\"0\"><properties>\
             <property name=\"kvgeom.shard\" value=\"1/4\"/></properties></testsuites>",
            "property kvgeom.total_cases is missing",
        );
    }

    #[test]
    fn errors_carry_the_offset_the_names_and_the_source() {
        let e = read("<testsuites name=\"kvgeom\" tests=\"x\" failures=\"0\"/>").unwrap_err();
        assert!(matches!(
            &e,
            JunitReadError::At {
                offset: 0,
                problem: JunitEventError::NotACount {
                    element: "testsuites",
                    attribute: "tests",
                    value,
                    ..
                },
            } if value == "x"
        ));
        assert_eq!(
            e.to_string(),
            "at byte 0: <testsuites tests=\"x\">: not a count"
        );
        let e =
            read("<testsuites name=\"kvgeom\" tests=\"0\" failures=\"0\">\n  <y/></testsuites>")
                .unwrap_err();
        assert!(matches!(
            &e,
            JunitReadError::At {
                offset: 52,
                problem: JunitEventError::UnexpectedElement {
                    parent: "testsuites",
                    element,
                },
            } if element == "y"
        ));
        let e = read("<testsuites name=\"kvgeom\" tests=\"0\" failures=\"0\"></a>").unwrap_err();
        assert!(matches!(e, JunitReadError::Malformed { .. }));
        assert!(std::error::Error::source(&e).is_some());
        let e = read(
            "<testsuites name=\"kvgeom\" tests=\"0\" failures=\"0\"><properties>\
             <property name=\"kvgeom.shard\" value=\"0/2\"/></properties></testsuites>",
        )
        .unwrap_err();
        assert!(matches!(
            &e,
            JunitReadError::BadShard { source } if source.text == "0/2"
        ));
        assert_eq!(
            e.to_string(),
            "property kvgeom.shard: `0/2`: expected K/N with 1 <= K <= N, e.g. 2/4"
        );
    }
}
