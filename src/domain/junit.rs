//! The little of a JUnit XML report the checks need: which test cases ran (by
//! `classname.name`) and which were skipped. Read by hand from the `<testcase>` elements, so
//! no XML library is needed; a report without a `<testsuite>` or `<testsuites>` root, or with
//! a test case it cannot read, is not a report (the checks' status is then `error`).

/// One test case of a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    /// `classname.name` (or `name` alone), entities decoded.
    pub id: String,
    pub skipped: bool,
}

/// The test cases of `xml`, or why it is not a JUnit report.
pub fn cases(xml: &str) -> Result<Vec<Case>, String> {
    if !xml.contains("<testsuite") {
        return Err("no <testsuite> or <testsuites> element".into());
    }
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(at) = rest.find("<testcase") {
        let after = &rest[at + "<testcase".len()..];
        // `<testcases>` or another name starting the same is not a test case.
        if !after.starts_with(|c: char| c.is_whitespace() || c == '>' || c == '/') {
            rest = after;
            continue;
        }
        let end = after
            .find('>')
            .ok_or_else(|| "a <testcase> element is not closed".to_owned())?;
        let tag = &after[..end];
        let self_closing = tag.trim_end().ends_with('/');
        let name = attribute(tag, "name").ok_or_else(|| "a <testcase> has no name".to_owned())?;
        let id = match attribute(tag, "classname").filter(|c| !c.is_empty()) {
            Some(class) => format!("{class}.{name}"),
            None => name,
        };
        let body_start = &after[end + 1..];
        let (body, next) = if self_closing {
            ("", body_start)
        } else {
            let close = body_start
                .find("</testcase>")
                .ok_or_else(|| format!("the test case `{id}` is not closed"))?;
            (
                &body_start[..close],
                &body_start[close + "</testcase>".len()..],
            )
        };
        out.push(Case {
            id,
            skipped: body.contains("<skipped"),
        });
        rest = next;
    }
    Ok(out)
}

/// The value of attribute `name` in a tag's text, entities decoded.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let mut rest = tag;
    loop {
        let at = rest.find(name)?;
        let before_ok = at == 0
            || rest[..at]
                .chars()
                .next_back()
                .is_some_and(char::is_whitespace);
        let after = rest[at + name.len()..].trim_start();
        if before_ok && let Some(value) = after.strip_prefix('=') {
            let value = value.trim_start();
            let quote = value.chars().next().filter(|q| *q == '"' || *q == '\'')?;
            let inner = &value[1..];
            let close = inner.find(quote)?;
            return Some(decode(&inner[..close]));
        }
        rest = &rest[at + name.len()..];
    }
}

fn decode(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_cases_are_read_with_their_class_and_whether_they_were_skipped() {
        let xml = r#"<?xml version="1.0"?>
<testsuites><testsuite name="calc" tests="3">
  <testcase classname="calc" name="adds" time="0.1"/>
  <testcase name='subtracts &amp; more' classname='calc'>
    <skipped message="later"/>
  </testcase>
  <testcase classname="calc" name="multiplies"><failure message="no">boom</failure></testcase>
</testsuite></testsuites>"#;
        let cases = cases(xml).expect("a report");
        assert_eq!(
            cases,
            vec![
                Case {
                    id: "calc.adds".into(),
                    skipped: false
                },
                Case {
                    id: "calc.subtracts & more".into(),
                    skipped: true
                },
                Case {
                    id: "calc.multiplies".into(),
                    skipped: false
                },
            ]
        );
    }

    #[test]
    fn what_is_not_a_report_is_said() {
        assert!(cases("plain text").is_err());
        assert!(cases("<testsuite><testcase classname=\"a\" name=\"b\">").is_err());
        assert!(cases("<testsuite><testcase classname=\"a\"/></testsuite>").is_err());
        assert_eq!(cases("<testsuite></testsuite>").expect("empty"), Vec::new());
    }
}
