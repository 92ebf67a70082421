//! `nsfast probe`: the table's header row and per-feature use/fallback within 100 columns
//! (reasons with `-v`), `--require` printing only what is missing and its exit codes
//! (0 all present, 1 naming what is missing, 2 for unknown names with the valid ones), and the
//! JSON document's fields. Runs the real binary; what is present is taken from its own
//! `--json` answer on this kernel, so the test holds on any kernel.

use std::process::{Command, Output};

use serde_json::Value;

fn nsfast(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nsfast"))
        .args(args)
        .output()
        .expect("run nsfast")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn report() -> Value {
    let o = nsfast(&["probe", "--json"]);
    assert!(o.status.success(), "probe --json: {}", text(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("probe --json is JSON")
}

/// (available, missing) feature names of this kernel.
fn split(r: &Value) -> (Vec<String>, Vec<String>) {
    let mut yes = Vec::new();
    let mut no = Vec::new();
    for f in r["features"].as_array().expect("features") {
        let name = f["name"].as_str().unwrap().to_string();
        if f["available"].as_bool().unwrap() {
            yes.push(name);
        } else {
            no.push(name);
        }
    }
    (yes, no)
}

#[test]
fn json_keeps_its_shape_and_adds_use_and_fallback() {
    let r = report();
    assert!(r["kernel_release"].is_string(), "{r}");
    assert!(r["kernel_version"]["major"].is_u64(), "{r}");
    for f in r["features"].as_array().unwrap() {
        for k in ["name", "reason", "enables", "fallback"] {
            assert!(
                f[k].as_str().is_some_and(|s| !s.is_empty()),
                "feature without {k}: {f}"
            );
        }
        assert!(f["available"].is_boolean(), "{f}");
    }
    // No --require: no required/missing fields.
    assert!(
        r.get("missing").is_none() && r.get("required").is_none(),
        "{r}"
    );
}

/// The rows of `out` (after the kernel line and the header): each feature's first line with
/// its continuation lines joined, whitespace squeezed.
fn rows(out: &str) -> Vec<String> {
    let mut rows: Vec<String> = Vec::new();
    for l in out.lines().skip(2) {
        let squeezed = l.split_whitespace().collect::<Vec<_>>().join(" ");
        if l.starts_with(' ') {
            if let Some(r) = rows.last_mut() {
                r.push(' ');
                r.push_str(&squeezed);
            }
        } else {
            rows.push(squeezed);
        }
    }
    rows
}

#[test]
fn table_has_a_header_row_and_says_what_each_feature_enables_or_replaces() {
    let r = report();
    let o = nsfast(&["probe"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("kernel "), "{out}");
    let header: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(header, ["FEATURE", "AVAILABLE", "NSFAST", "USES"], "{out}");
    let rows = rows(&out);
    for f in r["features"].as_array().unwrap() {
        let name = f["name"].as_str().unwrap();
        let row = rows
            .iter()
            .find(|l| l.split(' ').next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{out}"));
        let want = if f["available"].as_bool().unwrap() {
            format!("{name} yes enables: {}", f["enables"].as_str().unwrap())
        } else {
            format!("{name} no fallback: {}", f["fallback"].as_str().unwrap())
        };
        let want = want.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(row, &want, "{out}");
        // The reason is -v's and -j's.
        assert!(!out.contains(f["reason"].as_str().unwrap()), "{out}");
    }
}

/// Every line fits 100 columns, with -v too, and -v adds each feature's reason.
#[test]
fn table_fits_100_columns_and_v_adds_the_reasons() {
    let r = report();
    for args in [&["probe"][..], &["probe", "-v"][..]] {
        let o = nsfast(args);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let out = text(&o.stdout);
        for l in out.lines() {
            assert!(
                l.chars().count() <= 100,
                "{args:?}: {} columns: {l:?}",
                l.chars().count()
            );
        }
    }
    let out = text(&nsfast(&["probe", "-v"]).stdout);
    let squeezed = out.split_whitespace().collect::<Vec<_>>().join(" ");
    for f in r["features"].as_array().unwrap() {
        let reason = f["reason"].as_str().unwrap();
        let reason = reason.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            squeezed.contains(&format!("reason: {reason}")),
            "no {reason:?} in\n{out}"
        );
    }
}

#[test]
fn require_exits_0_when_present_and_1_naming_what_is_missing() {
    let r = report();
    let (yes, no) = split(&r);
    assert!(!yes.is_empty(), "no feature available at all: {r}");
    let o = nsfast(&["probe", "--require", &yes.join(",")]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        o.stdout.is_empty() && o.stderr.is_empty(),
        "nothing missing, nothing said: {o:?}"
    );

    // The VMCI and Hyper-V transports exist only under their hypervisors: something is missing
    // on every machine this runs on.
    assert!(!no.is_empty(), "every feature available: {r}");
    let ask = format!("{},{}", yes[0], no.join(","));
    let o = nsfast(&["probe", "--require", &ask]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    let first = err.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        format!(
            "nsfast: error: missing required kernel feature{}: {}",
            if no.len() == 1 { "" } else { "s" },
            no.join(", ")
        ),
        "{err}"
    );
    assert!(!err.contains(&format!("  {}:", yes[0])), "{err}");
    // Each missing feature's paragraph (reason, fallback) fits 100 columns too.
    for l in err.lines().skip(1) {
        assert!(
            l.chars().count() <= 100,
            "{} columns: {l:?}",
            l.chars().count()
        );
    }
    for n in &no {
        assert!(err.contains(&format!("\n  {n}: ")), "{err}");
    }
    // Only what is missing: no table on stdout (-v brings it back), and --json says the
    // same in fields.
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    let o = nsfast(&["probe", "-v", "--require", &ask]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stdout).contains("FEATURE"), "{}", text(&o.stdout));
    let o = nsfast(&["probe", "--json", "--require", &ask]);
    assert_eq!(o.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["missing"], serde_json::json!(no), "{doc}");
    assert_eq!(doc["required"][0], yes[0].as_str(), "{doc}");
}

#[test]
fn require_of_an_unknown_feature_exits_2_listing_the_valid_ones() {
    let o = nsfast(&["probe", "--require", "tcx,no_such_thing"]);
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(err.contains("'no_such_thing'"), "{err}");
    for f in report()["features"].as_array().unwrap() {
        assert!(err.contains(f["name"].as_str().unwrap()), "{err}");
    }
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
}
