//! junit.xml: well-formed (parsed with quick-xml), one testcase per checker, escaping.

use crate::fixture::{self, COMMAND, MESSAGE, UNKNOWN_REASON};
use quick_xml::events::Event as Xml;
use quick_xml::Reader;
use results::junit_xml;
use std::collections::BTreeMap;

/// An element as parsed: its name, attributes (unescaped) and text (unescaped).
#[derive(Debug, Default)]
struct Element {
    name: String,
    attrs: BTreeMap<String, String>,
    text: String,
}

fn element(e: &quick_xml::events::BytesStart) -> Element {
    let attrs = e
        .attributes()
        .map(|a| {
            let a = a.expect("attribute");
            let value = a.unescape_value().expect("escaped value").into_owned();
            (String::from_utf8(a.key.as_ref().to_vec()).unwrap(), value)
        })
        .collect();
    Element { name: String::from_utf8(e.name().as_ref().to_vec()).unwrap(), attrs, text: String::new() }
}

/// Parses the whole document, failing on any well-formedness error, into a flat element list.
fn parse(xml: &str) -> Vec<Element> {
    let mut reader = Reader::from_str(xml);
    reader.config_mut().check_end_names = true;
    let mut elements: Vec<Element> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    loop {
        match reader.read_event().expect("well-formed XML") {
            Xml::Start(e) => {
                open.push(elements.len());
                elements.push(element(&e));
            }
            Xml::Empty(e) => elements.push(element(&e)),
            Xml::Text(t) => {
                let text = t.unescape().expect("escaped text");
                match open.last() {
                    Some(&top) => elements[top].text += &text,
                    None => assert!(text.trim().is_empty(), "text outside the root: {text:?}"),
                }
            }
            Xml::End(_) => {
                open.pop();
            }
            Xml::Eof => break,
            _ => {}
        }
    }
    assert!(open.is_empty(), "every element is closed");
    elements
}

fn rendered() -> (String, Vec<Element>) {
    let events = fixture::history();
    let xml = junit_xml(&fixture::run(&events));
    let elements = parse(&xml);
    (xml, elements)
}

fn all<'a>(elements: &'a [Element], name: &str) -> Vec<&'a Element> {
    elements.iter().filter(|e| e.name == name).collect()
}

#[test]
fn one_suite_with_counts() {
    let (xml, elements) = rendered();
    assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"));
    assert_eq!(elements[0].name, "testsuites", "one report holds the suite");
    assert_eq!(elements[1].name, "testsuite");
    assert_eq!(all(&elements, "testsuite").len(), 1, "one suite");
    let suite = &elements[1].attrs;
    assert_eq!(suite["name"], "fencelab.stale-write");
    assert_eq!((suite["tests"].as_str(), suite["failures"].as_str(), suite["errors"].as_str()), ("3", "1", "1"));
    assert_eq!(suite["time"], "6.000");
    assert_eq!(suite["timestamp"], "2026-01-02T03:04:05Z");
    assert_eq!(suite["skipped"], "0");
}

#[test]
fn one_testcase_per_checker() {
    let (_, elements) = rendered();
    let cases = all(&elements, "testcase");
    let names: Vec<&str> = cases.iter().map(|c| c.attrs["name"].as_str()).collect();
    assert_eq!(names, ["stale-write", "single-completion", "lease-safety"]);
    assert!(cases.iter().all(|c| c.attrs["classname"] == "fencelab.checkers"));
}

#[test]
fn failure_carries_anomalies_unescaped_back_to_the_original() {
    let (xml, elements) = rendered();
    let failures = all(&elements, "failure");
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].attrs["type"], "invalid");
    assert_eq!(failures[0].attrs["message"], format!("1 anomaly: {MESSAGE}"));
    let events = fixture::history();
    let ids = fixture::anomaly(&events).events;
    let line = format!("[stale-step-applied] {MESSAGE} (events: {}, {}, {})", ids[0], ids[1], ids[2]);
    assert_eq!(failures[0].text, line);
    assert!(!xml.contains("<fence 1>") && xml.contains("&lt;fence 1&gt; applied &amp; &quot;accepted&quot;"));
}

#[test]
fn unknown_is_an_error_not_a_skip() {
    let (_, elements) = rendered();
    let errors = all(&elements, "error");
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].attrs["type"], "unknown");
    assert_eq!(errors[0].attrs["message"], UNKNOWN_REASON);
    assert_eq!(errors[0].text, UNKNOWN_REASON);
    assert!(all(&elements, "skipped").is_empty());
}

#[test]
fn properties_have_seed_and_command() {
    let (_, elements) = rendered();
    let props: BTreeMap<&str, &str> =
        all(&elements, "property").iter().map(|p| (p.attrs["name"].as_str(), p.attrs["value"].as_str())).collect();
    assert_eq!(props["seed"], "42");
    assert_eq!(props["command"], COMMAND);
    assert_eq!(props["overall"], "invalid");
}

#[test]
fn multi_line_and_control_characters_stay_well_formed() {
    let events = fixture::history();
    let mut run = fixture::run(&events);
    run.checkers[2].verdict = checkers::Verdict::Unknown { reason: "line one\nline <two>\u{1}]]>".into() };
    run.test_name = "a\"b'c<d>&e".into();
    let elements = parse(&junit_xml(&run));
    assert_eq!(elements[1].attrs["name"], "fencelab.a\"b'c<d>&e");
    let error = all(&elements, "error")[0];
    // A control character XML 1.0 cannot hold is left out; the rest is kept as it was.
    assert_eq!(error.attrs["message"], "line one\nline <two>]]>");
}

#[test]
fn with_stories_the_failure_tells_the_first_anomalys_story() {
    let events = fixture::history();
    let elements = parse(&results::junit_xml_with_stories(&fixture::run(&events), &events));
    let failure = all(&elements, "failure")[0];
    let story = crate::json::STORY.join("\n");
    assert_eq!(failure.attrs["message"], format!("1 anomaly: {MESSAGE}\nthe story:\n{story}"));
    let indented: Vec<String> = crate::json::STORY.iter().map(|line| format!("    {line}")).collect();
    assert!(failure.text.ends_with(&indented.join("\n")), "{}", failure.text);
    assert_eq!(all(&elements, "testcase").len(), 3);
}
