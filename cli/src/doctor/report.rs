//! What a check found and how it is shown: one line per check, an indented line of
//! advice when there is something to do, or the same as JSON.

use serde::Serialize;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Verdict {
    /// Nothing to do.
    Ok,
    /// Works, but worth fixing.
    Warn,
    /// Will not work until fixed; doctor exits non-zero.
    Fail,
    /// Context, not a judgement.
    Note,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Check {
    /// Stable identifier (`fuse`, `source`, ...); scripts match on it.
    pub(crate) name: &'static str,
    pub(crate) verdict: Verdict,
    /// What was found.
    pub(crate) summary: String,
    /// What to do about it, if anything.
    pub(crate) advice: Option<String>,
}

impl Check {
    pub(crate) fn new(name: &'static str, verdict: Verdict, summary: impl Into<String>) -> Check {
        let (summary, advice) = (summary.into(), None);
        Check {
            name,
            verdict,
            summary,
            advice,
        }
    }

    pub(crate) fn ok(name: &'static str, summary: impl Into<String>) -> Check {
        Check::new(name, Verdict::Ok, summary)
    }

    pub(crate) fn warn(name: &'static str, summary: impl Into<String>) -> Check {
        Check::new(name, Verdict::Warn, summary)
    }

    pub(crate) fn fail(name: &'static str, summary: impl Into<String>) -> Check {
        Check::new(name, Verdict::Fail, summary)
    }

    pub(crate) fn note(name: &'static str, summary: impl Into<String>) -> Check {
        Check::new(name, Verdict::Note, summary)
    }

    pub(crate) fn advise(mut self, advice: impl Into<String>) -> Check {
        self.advice = Some(advice.into());
        self
    }
}

/// The report for a terminal: `ok    fuse         summary`, advice indented below
/// (the columns are 6 and 13 wide).
pub(crate) fn render(checks: &[Check]) -> String {
    let mut out = String::new();
    for check in checks {
        let verdict = format!("{:?}", check.verdict).to_lowercase();
        out.push_str(&format!(
            "{verdict:<6}{:<13}{}\n",
            check.name, check.summary
        ));
        if let Some(advice) = &check.advice {
            out.push_str(&format!("{:19}{advice}\n", ""));
        }
    }
    out
}

/// Whether any check failed (the exit code).
pub(crate) fn any_failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.verdict == Verdict::Fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_aligned_lines_with_advice_below_or_json() -> serde_json::Result<()> {
        let fail = Check::fail("source", "did not answer").advise("check the share");
        let checks = [Check::ok("fuse", "/dev/fuse is usable"), fail];
        let expected = "ok    fuse         /dev/fuse is usable\n\
                        fail  source       did not answer\n\
                        \x20                  check the share\n";
        assert_eq!(render(&checks), expected);
        assert!(any_failed(&checks) && !any_failed(&checks[..1]));
        let json = serde_json::to_value(Check::note("mount", "not mounted"))?;
        let expected =
            r#"{"name": "mount", "verdict": "note", "summary": "not mounted", "advice": null}"#;
        assert_eq!(json, serde_json::from_str::<serde_json::Value>(expected)?);
        Ok(())
    }
}
