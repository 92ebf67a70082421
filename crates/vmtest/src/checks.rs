//! What a guest line must show besides exit code 0: libtest exits 0 when its filter matches
//! nothing, so a line passes only when its output proves it checked something.
//!
//! - `tests=N`: the libtest summaries (`test result: ok. N passed; M failed; K ignored; ...`,
//!   one per test binary) add up to exactly N tests run (passed + failed);
//! - `min-tests=N`: at least N;
//! - `expect=REGEX` (repeatable; quote with "..." for spaces): some output line matches each;
//! - `reject=REGEX` (repeatable): no output line matches.
//!
//! A line that declares none of `tests`, `min-tests` and `expect` must run at least one test.

use regex_automata::meta::Regex;

/// A line's declared checks (attributes in guest-tests.txt).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checks {
    pub tests: Option<u32>,
    pub min_tests: Option<u32>,
    pub expect: Vec<String>,
    pub reject: Vec<String>,
}

/// One libtest summary line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub ok: bool,
    pub passed: u32,
    pub failed: u32,
    pub ignored: u32,
    pub filtered_out: u32,
}

/// Parses `test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 5 filtered out; ...`
/// found anywhere in `line` (a kernel message can share the console line).
pub fn parse_summary(line: &str) -> Option<Summary> {
    let rest = &line[line.find("test result: ")? + "test result: ".len()..];
    let (verdict, counts) = rest.split_once(". ")?;
    let ok = match verdict {
        "ok" => true,
        "FAILED" => false,
        _ => return None,
    };
    let mut s = Summary {
        ok,
        ..Summary::default()
    };
    let mut seen = 0;
    for part in counts.split(';') {
        let part = part.trim();
        let Some((n, what)) = part.split_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else {
            continue;
        };
        let field = match what {
            "passed" => &mut s.passed,
            "failed" => &mut s.failed,
            "ignored" => &mut s.ignored,
            "filtered out" => &mut s.filtered_out,
            _ => continue,
        };
        *field = n;
        seen += 1;
    }
    // passed, failed and ignored are always there.
    (seen >= 3).then_some(s)
}

/// The summaries of every test binary a line ran, added up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Count {
    /// Summary lines seen (one per test binary).
    pub binaries: u32,
    pub passed: u32,
    pub failed: u32,
    pub ignored: u32,
}

impl Count {
    pub fn from_output<S: AsRef<str>>(lines: &[S]) -> Count {
        let mut c = Count::default();
        for s in lines.iter().filter_map(|l| parse_summary(l.as_ref())) {
            c.binaries += 1;
            c.passed += s.passed;
            c.failed += s.failed;
            c.ignored += s.ignored;
        }
        c
    }

    /// Tests that ran (ignored ones did not).
    pub fn ran(&self) -> u32 {
        self.passed + self.failed
    }
}

/// Compiles a pattern; the error names it.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    Regex::new(pattern).map_err(|e| format!("invalid pattern {pattern:?}: {e}"))
}

/// Judges a line that exited 0 by its output: `Ok(what it showed)` or `Err(why it fails)`.
pub fn judge<S: AsRef<str>>(c: &Checks, output: &[S]) -> Result<String, String> {
    let count = Count::from_output(output);
    let mut shown = Vec::new();
    let min = match (c.tests, c.min_tests) {
        (None, None) if c.expect.is_empty() => Some(1),
        (_, m) => m,
    };
    if let Some(n) = c.tests {
        if count.ran() != n {
            return Err(format!(
                "ran {} test(s) in {} binar{}, declared tests={n} (a filter that matches \
                 nothing, or tests added/removed without updating tests/vm/guest-tests.txt)",
                count.ran(),
                count.binaries,
                if count.binaries == 1 { "y" } else { "ies" }
            ));
        }
    }
    if let Some(n) = min {
        if count.ran() < n {
            return Err(format!(
                "ran {} test(s) in {} binar{}, fewer than the {n} declared (min-tests={n}{}): a filter that matches nothing passes libtest",
                count.ran(),
                count.binaries,
                if count.binaries == 1 { "y" } else { "ies" },
                if c.min_tests.is_none() && c.tests.is_none() {
                    ", the default for a line that declares no check"
                } else {
                    ""
                }
            ));
        }
    }
    if c.tests.is_some() || min.is_some() {
        shown.push(format!("{} test(s) ran", count.ran()));
    }
    for p in &c.expect {
        let re = compile(p)?;
        if !output.iter().any(|l| re.is_match(l.as_ref())) {
            return Err(format!("no output line matches expect={p:?}"));
        }
        shown.push(format!("output matches {p:?}"));
    }
    for p in &c.reject {
        let re = compile(p)?;
        if let Some(l) = output.iter().find(|l| re.is_match(l.as_ref())) {
            return Err(format!(
                "output line {:?} matches reject={p:?}",
                l.as_ref().trim()
            ));
        }
    }
    Ok(shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libtest_summaries() {
        let s = parse_summary(
            "test result: ok. 12 passed; 0 failed; 3 ignored; 0 measured; 7 filtered out; finished in 1.23s",
        )
        .unwrap();
        assert_eq!(
            s,
            Summary {
                ok: true,
                passed: 12,
                failed: 0,
                ignored: 3,
                filtered_out: 7
            }
        );
        let s = parse_summary("[  3.2] x: ytest result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s").unwrap();
        assert!(!s.ok && s.failed == 2 && s.passed == 1);
        assert_eq!(
            parse_summary("test result: maybe. 1 passed; 0 failed; 0 ignored"),
            None
        );
        assert_eq!(parse_summary("running 3 tests"), None);
        assert_eq!(parse_summary("test result: ok."), None);
    }

    fn out(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|s| s.to_string()).collect()
    }

    const NONE_RAN: &str =
        "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 14 filtered out; finished in 0.00s";

    #[test]
    fn a_line_that_ran_no_test_fails_by_default() {
        let c = Checks::default();
        let e = judge(&c, &out(&["running 0 tests", NONE_RAN])).unwrap_err();
        assert!(e.contains("ran 0 test(s) in 1 binary"), "{e}");
        let e = judge(&c, &out(&["no libtest here"])).unwrap_err();
        assert!(e.contains("ran 0 test(s) in 0 binaries"), "{e}");
        // The positive control.
        let ok = "test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 12 filtered out; finished in 0.3s";
        assert_eq!(judge(&c, &out(&[ok])).unwrap(), "2 test(s) ran");
    }

    #[test]
    fn declared_counts_add_up_over_binaries() {
        let lines = out(&[
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s",
            "test result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s",
        ]);
        let exact = |n| Checks {
            tests: Some(n),
            ..Checks::default()
        };
        let min = |n| Checks {
            min_tests: Some(n),
            ..Checks::default()
        };
        assert!(judge(&exact(7), &lines).is_ok());
        let e = judge(&exact(8), &lines).unwrap_err();
        assert!(
            e.contains("ran 7 test(s) in 2 binaries, declared tests=8"),
            "{e}"
        );
        assert!(judge(&exact(6), &lines).is_err());
        assert!(judge(&min(7), &lines).is_ok());
        assert!(judge(&min(5), &lines).is_ok());
        let e = judge(&min(8), &lines).unwrap_err();
        assert!(e.contains("fewer than the 8 declared"), "{e}");
    }

    #[test]
    fn expect_and_reject_patterns() {
        let c = Checks {
            expect: vec![r"^ok\s+netkit\b".into(), "vsock round trip".into()],
            reject: vec!["MISMATCH".into()],
            ..Checks::default()
        };
        let good = out(&[
            "kernel 6.12",
            "ok       netkit  probe=yes",
            "vsock round trip ok",
        ]);
        assert_eq!(
            judge(&c, &good).unwrap(),
            r#"output matches "^ok\\s+netkit\\b", output matches "vsock round trip""#
        );
        let e = judge(&c, &out(&["ok netkit"])).unwrap_err();
        assert!(e.contains("expect=\"vsock round trip\""), "{e}");
        let mut bad = good.clone();
        bad.push("MISMATCH tcx".into());
        let e = judge(&c, &bad).unwrap_err();
        assert!(e.contains("\"MISMATCH tcx\" matches reject"), "{e}");
        // expect= alone needs no libtest summary; with min-tests both must hold.
        let both = Checks {
            min_tests: Some(1),
            ..c.clone()
        };
        assert!(judge(&both, &good).unwrap_err().contains("ran 0 test(s)"));
        assert!(compile("(").is_err());
    }
}
