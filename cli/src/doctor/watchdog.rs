//! macOS Metal watchdog context. The text is built on every platform so it is
//! tested; doctor shows it only on macOS.

use crate::run::RELAX_WATCHDOG_VAR as VAR;

use super::report::Check;

/// The notes, given the variable's value in doctor's own environment.
fn notes(value: Option<&str>) -> Vec<Check> {
    let state = match value {
        Some(value) => format!("{VAR}={value} is set in this environment"),
        None => format!("{VAR} is not set in this environment"),
    };
    vec![
        Check::note("gpu-watchdog", state).advise(
            "it relaxes the Metal command-buffer watchdog only for a process that starts with it, before Metal initialises: set it where the program is launched, or use `stagefs run --relax-gpu-watchdog -- COMMAND`",
        ),
        Check::note(
            "gpu-eval",
            "staging cannot help a single mx.eval over roughly 300 GB: that GPU work alone can outlast the watchdog",
        )
        .advise("evaluate such graphs in chunks (several smaller mx.eval calls)"),
        Check::note("gpu-display", "with a display active, the GPU interactivity watchdog is stricter")
            .advise("run long GPU jobs with the display asleep or from a remote session"),
    ]
}

/// The notes for this process, on macOS only.
pub(crate) fn checks() -> Vec<Check> {
    if !cfg!(target_os = "macos") {
        return Vec::new();
    }
    let value = std::env::var_os(VAR);
    notes(
        value
            .as_deref()
            .map(|v| v.to_str().unwrap_or("(not UTF-8)")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_whether_the_variable_is_set_and_how_to_set_it() {
        let unset = notes(None);
        let expected = "AGX_RELAX_CDM_CTXSTORE_TIMEOUT is not set in this environment";
        assert_eq!(unset[0].summary, expected);
        let advice = unset[0].advice.as_deref().unwrap_or_default();
        assert!(advice.contains("before Metal initialises"), "{advice}");
        assert!(
            advice.contains("stagefs run --relax-gpu-watchdog"),
            "{advice}"
        );
        assert!(notes(Some("1"))[0].summary.contains("=1 is set"));
        let all: String = unset.iter().map(|c| c.summary.clone()).collect();
        assert!(all.contains("300 GB") && all.contains("display"), "{all}");
        assert_eq!(checks().is_empty(), !cfg!(target_os = "macos"));
    }
}
