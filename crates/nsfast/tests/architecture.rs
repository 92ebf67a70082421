//! The architecture, enforced (docs/architecture.md):
//! - no module-level import cycle inside any crate of the workspace;
//! - the crate layering: a system crate (sockmap, pod, cni, vsock, vpnrelay) never depends on
//!   another system crate, and no product crate has a test-world crate (`TEST_WORLDS`:
//!   nsfast-lab) as a normal dependency, except nsfast-bench for nsfast-lab.
//!
//! The module graph is read from the sources: every crate root (`lib.rs`, `main.rs`, `bin/*.rs`)
//! and the files its `mod x;` declarations reach are modules; an edge A -> B is a
//! `crate::b::..` path (in a `use` or in code, groups `crate::{a, b}` included) or a `super::`
//! path in A's file that names B. The crate root itself is left out of the graph: it is the
//! crate's facade (module declarations, re-exports, the crate-wide error type every module may
//! use), so `crate::Error` from a module is not a cycle with the root's `mod` lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/nsfast has a workspace root two levels up")
        .to_path_buf()
}

/// Known import cycles, each owned by a helper who is removing it. An entry drops both edges
/// between the two modules of that crate. The test fails when an entry is no longer needed,
/// so the list only shrinks.
const CYCLE_ALLOW: &[(&str, &str, &str, &str)] = &[];

/// Documented exceptions to the layering (package, dependency, where it is documented).
const LAYER_EXCEPTIONS: &[(&str, &str, &str)] = &[(
    "nsfast-cni",
    "nsfast-pod",
    "docs/status.md, Choices that differ: nsfast-cni is the CNI front end of the pod datapath",
)];

/// Known layering violations (package, dependency), each with its owner; the test fails when
/// one is no longer there, so the list only shrinks.
const LAYER_ALLOW: &[(&str, &str, &str)] = &[];

// ---------------------------------------------------------------------------------------------
// Module graph

/// Source with comments, string and char literals blanked out (kept the same length, lines
/// kept), so that neither `crate::` in a doc comment nor a `{` in a string counts.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"') | Some(b'#')) && !ident(b, i) {
            // raw string r"..." / r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &x in &b[i..j.min(b.len())] {
                blank(&mut out, x);
            }
            i = j;
        } else if c == b'"' {
            blank(&mut out, c);
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            if i < b.len() {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let end = if b.get(i + 1) == Some(&b'\\') {
                (i + 2..b.len().min(i + 12)).find(|&j| b[j] == b'\'')
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    for &x in &b[i..=e] {
                        blank(&mut out, x);
                    }
                    i = e + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).expect("blanking keeps ASCII structure")
}

fn ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// One module: its path inside the crate (`[]` for the root) and its file.
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

/// `mod x;` declarations of a (stripped) source at brace depth 0, with their `#[path]`.
fn mod_decls(raw: &str, stripped: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let raw_lines: Vec<&str> = raw.lines().collect();
    let mut depth = 0i32;
    for (n, line) in stripped.lines().enumerate() {
        let t = line.trim();
        if depth == 0 {
            let words: Vec<&str> = t.split_whitespace().collect();
            let pos = words.iter().position(|w| *w == "mod");
            if let Some(p) = pos {
                if words[..p]
                    .iter()
                    .all(|w| w.starts_with("pub") || w.starts_with("#["))
                {
                    if let Some(name) = words.get(p + 1).and_then(|w| w.strip_suffix(';')) {
                        let attr = n
                            .checked_sub(1)
                            .and_then(|m| raw_lines.get(m))
                            .map(|l| l.trim())
                            .filter(|l| l.starts_with("#[path"))
                            .and_then(|l| l.split('"').nth(1))
                            .map(str::to_string);
                        out.push((name.to_string(), attr));
                    }
                }
            }
        }
        for c in line.bytes() {
            match c {
                b'{' => depth += 1,
                b'}' => depth -= 1,
                _ => {}
            }
        }
    }
    out
}

/// Every module of the crate rooted at `root`.
fn crate_modules(root: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let mut todo = vec![(Vec::<String>::new(), root.to_path_buf(), true)];
    while let Some((path, file, owns_dir)) = todo.pop() {
        let raw = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let stripped = strip(&raw);
        // Where this file's child modules live: next to a root / mod.rs, else in a dir named
        // after it.
        let dir = if owns_dir {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        for (name, attr) in mod_decls(&raw, &stripped) {
            let mut p = path.clone();
            p.push(name.clone());
            let (child, child_owns) = if let Some(a) = attr {
                (file.parent().unwrap().join(a), false)
            } else if dir.join(format!("{name}.rs")).is_file() {
                (dir.join(format!("{name}.rs")), false)
            } else if dir.join(&name).join("mod.rs").is_file() {
                (dir.join(&name).join("mod.rs"), true)
            } else {
                panic!("{}: mod {name}; has no file", file.display());
            };
            todo.push((p, child, child_owns));
        }
        out.push(Module { path, file });
    }
    out
}

/// The module paths a file names: `crate::a::b` and `super::x` (resolved against `me`).
/// `super::` inside an inline `mod tests { .. }` names the file's own module.
fn references(stripped: &str, me: &[String]) -> Vec<Vec<String>> {
    let b = stripped.as_bytes();
    let mut out = Vec::new();
    // Brace depths at which inline modules opened.
    let mut inline_mods: Vec<i32> = Vec::new();
    let mut depth = 0i32;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'{' {
            depth += 1;
            // `mod name {` just before?
            let before = stripped[..i].trim_end();
            let mut words = before.rsplit(|c: char| c.is_whitespace());
            let _name = words.next();
            if words.next() == Some("mod") {
                inline_mods.push(depth);
            }
            i += 1;
            continue;
        }
        if c == b'}' {
            if inline_mods.last() == Some(&depth) {
                inline_mods.pop();
            }
            depth -= 1;
            i += 1;
            continue;
        }
        let at_word = !ident(b, i) && (i == 0 || b[i - 1] != b'$');
        if at_word && stripped[i..].starts_with("crate::") {
            let (paths, end) = parse_path_tail(stripped, i + "crate::".len());
            for p in paths {
                out.push(p);
            }
            i = end;
            continue;
        }
        if at_word && stripped[i..].starts_with("super::") {
            let mut base: Vec<String> = me.to_vec();
            let mut j = i;
            // Inside an inline module, the first `super` is the file's module itself.
            let mut skip = !inline_mods.is_empty();
            while stripped[j..].starts_with("super::") {
                if skip {
                    skip = false;
                } else {
                    base.pop();
                }
                j += "super::".len();
            }
            let (paths, end) = parse_path_tail(stripped, j);
            for p in paths {
                let mut full = base.clone();
                full.extend(p);
                out.push(full);
            }
            i = end;
            continue;
        }
        i += 1;
    }
    out
}

/// The paths after `crate::` at `start`: `a::b::C` -> `[a, b, C]`, `{a::X, b}` -> `[[a, X], [b]]`.
fn parse_path_tail(s: &str, start: usize) -> (Vec<Vec<String>>, usize) {
    let b = s.as_bytes();
    let mut i = start;
    let mut segs = Vec::new();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            // A group: each top-level item's leading segments.
            let mut depth = 0;
            let mut j = i;
            let mut items = Vec::new();
            let mut cur = String::new();
            while j < b.len() {
                match b[j] {
                    b'{' => {
                        depth += 1;
                        if depth > 1 {
                            cur.push('{');
                        }
                    }
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            items.push(std::mem::take(&mut cur));
                            j += 1;
                            break;
                        }
                        cur.push('}');
                    }
                    b',' if depth == 1 => items.push(std::mem::take(&mut cur)),
                    c => cur.push(c as char),
                }
                j += 1;
            }
            let mut out = Vec::new();
            for it in items {
                let it = it.trim();
                if it.is_empty() {
                    continue;
                }
                let (sub, _) = parse_path_tail(it, 0);
                for p in sub {
                    let mut full = segs.clone();
                    full.extend(p);
                    out.push(full);
                }
            }
            return (out, j);
        }
        let st = i;
        while i < b.len() && is_ident_byte(b[i]) {
            i += 1;
        }
        if st == i {
            break;
        }
        segs.push(s[st..i].to_string());
        if s[i..].starts_with("::") {
            i += 2;
        } else {
            break;
        }
    }
    (vec![segs], i)
}

/// The longest module path of `known` that `path` starts with.
fn resolve(path: &[String], known: &BTreeSet<Vec<String>>) -> Vec<String> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| known.contains(p))
        .unwrap_or_default()
}

fn name(p: &[String]) -> String {
    if p.is_empty() {
        "crate".into()
    } else {
        p.join("::")
    }
}

/// The crate roots of a package: lib.rs, main.rs, bin/*.rs (each its own crate).
fn crate_roots(pkg_dir: &Path) -> Vec<(String, PathBuf)> {
    let src = pkg_dir.join("src");
    let mut roots = Vec::new();
    for f in ["lib.rs", "main.rs"] {
        if src.join(f).is_file() {
            roots.push((f.trim_end_matches(".rs").to_string(), src.join(f)));
        }
    }
    if let Ok(rd) = std::fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        bins.sort();
        for b in bins {
            if b.extension().is_some_and(|e| e == "rs") {
                let n = b.file_stem().unwrap().to_string_lossy().into_owned();
                roots.push((format!("bin/{n}"), b));
            } else if b.join("main.rs").is_file() {
                let n = b.file_name().unwrap().to_string_lossy().into_owned();
                roots.push((format!("bin/{n}"), b.join("main.rs")));
            }
        }
    }
    roots
}

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module graph of one crate (root excluded), edges from each module to the modules it
/// names.
fn module_graph(root: &Path) -> Graph {
    let mods = crate_modules(root);
    let known: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    let mut g = Graph::new();
    for m in &mods {
        if m.path.is_empty() {
            continue;
        }
        let src = std::fs::read_to_string(&m.file).unwrap();
        let edges = g.entry(name(&m.path)).or_default();
        for r in references(&strip(&src), &m.path) {
            let target = resolve(&r, &known);
            // Not the root; not itself; not its own submodules (a parent owns its children).
            if target.is_empty() || target == m.path || target.starts_with(&m.path) {
                continue;
            }
            edges.insert(name(&target));
        }
    }
    g
}

/// One cycle of `g` (as the module list A -> B -> .. -> A), if any.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum St {
        New,
        Open,
        Done,
    }
    fn visit(
        n: &str,
        g: &Graph,
        st: &mut BTreeMap<String, St>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        st.insert(n.to_string(), St::Open);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            match st.get(m).copied().unwrap_or(St::New) {
                St::Open => {
                    let at = stack.iter().position(|x| x == m).unwrap();
                    let mut cyc = stack[at..].to_vec();
                    cyc.push(m.clone());
                    return Some(cyc);
                }
                St::New => {
                    if let Some(c) = visit(m, g, st, stack) {
                        return Some(c);
                    }
                }
                St::Done => {}
            }
        }
        stack.pop();
        st.insert(n.to_string(), St::Done);
        None
    }
    let mut st = BTreeMap::new();
    for n in g.keys() {
        if st.get(n).copied().unwrap_or(St::New) == St::New {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, g, &mut st, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

struct Package {
    name: String,
    dir: PathBuf,
    /// (dependency name, kind: "normal" / "dev" / "build")
    deps: Vec<(String, String)>,
}

fn packages() -> Vec<Package> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    v["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().unwrap().to_string(),
            dir: Path::new(p["manifest_path"].as_str().unwrap())
                .parent()
                .unwrap()
                .to_path_buf(),
            deps: p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    (
                        d["name"].as_str().unwrap().to_string(),
                        d["kind"].as_str().unwrap_or("normal").to_string(),
                    )
                })
                .collect(),
        })
        .collect()
}

#[test]
fn no_module_import_cycles() {
    let mut failures = Vec::new();
    let mut used_allow = BTreeSet::new();
    let mut crates = 0;
    for pkg in packages() {
        for (kind, root) in crate_roots(&pkg.dir) {
            crates += 1;
            let mut g = module_graph(&root);
            for (i, &(p, a, b, _owner)) in CYCLE_ALLOW.iter().enumerate() {
                if p != pkg.name {
                    continue;
                }
                let ab = g.get_mut(a).map(|s| s.remove(b)).unwrap_or(false);
                let ba = g.get_mut(b).map(|s| s.remove(a)).unwrap_or(false);
                if ab && ba {
                    used_allow.insert(i);
                }
            }
            // Report every cycle: remove one edge of each found and look again.
            while let Some(cyc) = find_cycle(&g) {
                failures.push(format!("{} ({kind}): {}", pkg.name, cyc.join(" -> ")));
                let (a, b) = (&cyc[cyc.len() - 2], &cyc[cyc.len() - 1]);
                g.get_mut(a).unwrap().remove(b);
            }
        }
    }
    assert!(
        crates >= 10,
        "found only {crates} crates: is the scan broken?"
    );
    for (i, (p, a, b, owner)) in CYCLE_ALLOW.iter().enumerate() {
        if !used_allow.contains(&i) {
            failures.push(format!(
                "allow-list entry {p}: {a} <-> {b} ({owner}) is no longer a cycle: remove it from CYCLE_ALLOW"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "module import cycles (see docs/architecture.md):\n  {}",
        failures.join("\n  ")
    );
}

const SYSTEM: &[&str] = &[
    "nsfast-sockmap",
    "nsfast-pod",
    "nsfast-cni",
    "nsfast-vsock",
    "nsfast-vpnrelay",
];
const TEST_WORLDS: &[&str] = &["nsfast-lab"];

/// A layering violation: (package, dependency, why).
type Violation = (String, String, &'static str);

/// The layering violations of `pkgs` that [`LAYER_EXCEPTIONS`] does not except.
fn layering_violations(pkgs: &[Package]) -> BTreeSet<Violation> {
    let mut violations = BTreeSet::new();
    for p in pkgs {
        if TEST_WORLDS.contains(&p.name.as_str()) {
            continue;
        }
        for (d, kind) in &p.deps {
            if kind == "dev" {
                continue;
            }
            let excepted = LAYER_EXCEPTIONS
                .iter()
                .any(|(ep, ed, _)| *ep == p.name && ed == d);
            if SYSTEM.contains(&p.name.as_str()) && SYSTEM.contains(&d.as_str()) && !excepted {
                violations.insert((
                    p.name.clone(),
                    d.clone(),
                    "a system crate depends on another system crate (move what they share into nsfast-sys)",
                ));
            }
            let bench_lab = p.name == "nsfast-bench" && d == "nsfast-lab";
            if TEST_WORLDS.contains(&d.as_str()) && kind == "normal" && !bench_lab {
                violations.insert((
                    p.name.clone(),
                    d.clone(),
                    "a product crate has the test worlds as a normal dependency (dev-dependency only; bench through nsfast-lab)",
                ));
            }
        }
    }
    violations
}

#[test]
fn crate_layering() {
    let pkgs = packages();
    // Every crate the rules name exists: a renamed or removed crate must leave the lists,
    // or its rule checks nothing.
    let names: BTreeSet<&str> = pkgs.iter().map(|p| p.name.as_str()).collect();
    let named = SYSTEM
        .iter()
        .chain(TEST_WORLDS)
        .copied()
        .chain(LAYER_EXCEPTIONS.iter().flat_map(|(p, d, _)| [*p, *d]))
        .chain(LAYER_ALLOW.iter().flat_map(|(p, d, _)| [*p, *d]))
        .chain(["nsfast", "nsfast-bench"]);
    let missing: Vec<&str> = named.filter(|n| !names.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "the layering rules name crates cargo metadata does not list: {missing:?} (workspace: {names:?})"
    );
    let violations = layering_violations(&pkgs);
    let mut failures = Vec::new();
    for (p, d, why) in &violations {
        if !LAYER_ALLOW.iter().any(|(ap, ad, _)| ap == p && ad == d) {
            failures.push(format!("{p} -> {d}: {why}"));
        }
    }
    for (p, d, owner) in LAYER_ALLOW {
        if !violations.iter().any(|(vp, vd, _)| vp == p && vd == d) {
            failures.push(format!(
                "allow-list entry {p} -> {d} ({owner}) is no longer a violation: remove it from LAYER_ALLOW"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "crate layering (see docs/architecture.md):\n  {}",
        failures.join("\n  ")
    );
}

/// The layering check itself, on made-up packages: what it must flag, and what it must let
/// through (dev-dependencies, bench on the lab, the documented cni -> pod exception).
#[test]
fn layering_check_flags_what_breaks_the_rules() {
    let pkg = |name: &str, deps: &[(&str, &str)]| Package {
        name: name.into(),
        dir: PathBuf::new(),
        deps: deps
            .iter()
            .map(|(d, k)| (d.to_string(), k.to_string()))
            .collect(),
    };
    let pkgs = [
        pkg(
            "nsfast-vsock",
            &[("nsfast-sockmap", "normal"), ("nsfast-lab", "dev")],
        ),
        pkg("nsfast-pod", &[("nsfast-lab", "normal")]),
        pkg(
            "nsfast",
            &[("nsfast-lab", "normal"), ("nsfast-bench", "normal")],
        ),
        pkg(
            "nsfast-sockmap",
            &[("nsfast-lab", "build"), ("nsfast-sys", "normal")],
        ),
        pkg(
            "nsfast-bench",
            &[("nsfast-lab", "normal"), ("nsfast-pod", "normal")],
        ),
        pkg("nsfast-cni", &[("nsfast-pod", "normal")]),
        pkg("nsfast-lab", &[("nsfast-pod", "normal")]),
    ];
    let got: BTreeSet<(String, String)> = layering_violations(&pkgs)
        .into_iter()
        .map(|(p, d, _)| (p, d))
        .collect();
    let want: BTreeSet<(String, String)> = [
        ("nsfast-vsock", "nsfast-sockmap"),
        ("nsfast-pod", "nsfast-lab"),
        ("nsfast", "nsfast-lab"),
    ]
    .into_iter()
    .map(|(p, d)| (p.to_string(), d.to_string()))
    .collect();
    assert_eq!(got, want);
}

/// The scanner itself: the path forms it must see, and what it must not.
#[test]
fn scanner_finds_paths_and_skips_comments_and_strings() {
    let src = r#"
        use crate::a::B;
        use crate::{b::C, c, d::{E, F}};
        // use crate::commented;
        /// [`crate::doc`]
        fn f() { let _ = "crate::string {"; crate::e::g(); let _ = '{'; }
        mod tests { use super::*; use super::super::up::X; }
        use super::sibling;
    "#;
    let me = vec!["m".to_string(), "n".to_string()];
    let refs: BTreeSet<String> = references(&strip(src), &me)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    let want: BTreeSet<String> = [
        "a::B",
        "b::C",
        "c",
        "d::E",
        "d::F",
        "e::g",
        "m::n",
        "m::up::X",
        "m::sibling",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(refs, want);
}
