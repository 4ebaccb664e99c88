//! The data plane's layering, checked on its source (docs/architecture.md, "The pipeline"):
//!
//! 1. No file of `src/` is in an import cycle with another. The file-level import graph is
//!    built from the module tree (`mod` declarations from `lib.rs`, `#[path]` honoured,
//!    inline modules tracked) and every `use` tree and path in code that starts with `crate::`,
//!    `super::`, `self::`, a child module's name or the name a `use` gave a module in that
//!    scope (`use crate::pipeline;` then `pipeline::seal::queue()`, renames included): an
//!    edge goes from a file to the file that defines the longest module prefix of the path. A
//!    `mod` declaration is containment, not an import (a child may use its parent's items).
//!    The graph must have edges, among them `pipeline/graph.rs -> pipeline/seal.rs` (a check
//!    that reads nothing finds no cycle).
//! 2. No file outside `sys/` and the I/O stage (`io/`) touches a socket or the TUN device:
//!    its non-test code names none of the socket calls and types in [`SOCKET_WORDS`] or
//!    `libc::` socket calls in [`LIBC_CALLS`], in code or in `use` statements (so a rename,
//!    `use netio::UdpSocket as S;`, is caught). Test code (`#[cfg(test)]` modules, `tests`
//!    modules, `testutil`) is exempt: tests open sockets to drive the data plane.
//!
//! 3. The pipeline's stages ([`STAGES`], in order) import only earlier stages, and the
//!    shared state modules import no stage: only the [`RUNNERS`] wire stages together.
//!
//! `LAYERING_SRC=<dir>` checks another source tree (e.g. an older revision) instead of this
//! crate's `src/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Socket (and TUN device) calls and types only `sys/` and `io/` may name.
const SOCKET_WORDS: &[&str] = &[
    "recvmmsg",
    "sendmmsg",
    "recvmsg",
    "sendmsg",
    "recv_from",
    "send_to",
    "recv_batch",
    "send_batch",
    "read_batch",
    "push_or_flush",
    "UdpSocket",
    "TcpStream",
    "SocketOptions",
];

/// `libc::` calls only `sys/` and `io/` may make.
const LIBC_CALLS: &[&str] = &[
    "socket",
    "bind",
    "connect",
    "recv",
    "send",
    "recvfrom",
    "sendto",
    "recvmsg",
    "sendmsg",
    "recvmmsg",
    "sendmmsg",
    "setsockopt",
    "getsockopt",
    "read",
    "write",
    "readv",
    "writev",
];

/// The pipeline's stages in order: a stage may import earlier stages only, and files that are
/// neither stages nor [`RUNNERS`] (the shared state: tables, stats, the send batch...) import
/// none.
const STAGES: &[&str] = &[
    "io/input.rs",
    "pipeline/classify.rs",
    "pipeline/open.rs",
    "pipeline/decap.rs",
    "pipeline/seal.rs",
    "pipeline/encap.rs",
    "pipeline/attach.rs",
    "io/output.rs",
];

/// Files that wire the stages together (and the crate root, module files, tests).
const RUNNERS: &[&str] = &[
    "lib.rs",
    "dataplane.rs",
    "worker.rs",
    "pipeline/graph.rs",
    "pipeline/mod.rs",
    "io/mod.rs",
];

/// Directories (relative to `src/`) whose files may touch sockets.
const IO_DIRS: &[&str] = &["sys/", "io/"];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Punct(char),
    /// `::`
    Path,
    /// A string literal's contents.
    Str(String),
}

/// Tokens of Rust source without comments, char and byte literals; string literals are kept
/// whole (never read as paths).
fn lex(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == 'r' && (c.get(i + 1) == Some(&'"') || c.get(i + 1) == Some(&'#')) && {
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            c.get(j) == Some(&'"')
        } {
            // Raw string r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if ch == '"' {
            i += 1;
            let start = i;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            out.push(Tok::Str(c[start..i.min(c.len())].iter().collect()));
            i += 1;
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if c.get(i + 1) == Some(&'\\') {
                let mut j = i + 2;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // Byte strings and byte chars: b"..", b'..'.
            if word == "b" && matches!(c.get(i), Some('"') | Some('\'')) {
                continue;
            }
            out.push(Tok::Ident(word));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok::Path);
            i += 2;
        } else if ch.is_whitespace() || ch.is_ascii_digit() {
            i += 1;
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

/// One source file's facts.
#[derive(Debug, Default)]
struct FileFacts {
    /// Module declarations with a file: (module path, `#[path]` value).
    mods: Vec<(Vec<String>, Option<String>)>,
    /// Inline modules (module paths).
    inline: Vec<Vec<String>>,
    /// Paths used: (module path of the scope, segments, in test code).
    uses: Vec<(Vec<String>, Vec<String>, bool)>,
    /// Names `use` gave in a scope: (module path of the scope, name, segments).
    names: Vec<(Vec<String>, String, Vec<String>)>,
    /// Paths in code starting with a plain name (`x::y`): (scope, segments, in test code);
    /// an import when `x` is a child module or a name `use` gave a module.
    plain: Vec<(Vec<String>, Vec<String>, bool)>,
    /// Socket words named outside test code.
    socket_words: BTreeSet<String>,
}

/// A path of a use tree and the name it is given in scope (`as` or its last segment; None
/// for a glob).
type UsePath = (Vec<String>, Option<String>);

/// Expands a use tree starting at `toks[i]`; returns the index after it.
fn use_tree(toks: &[Tok], mut i: usize, prefix: &[String], out: &mut Vec<UsePath>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(i) {
            Some(Tok::Ident(w)) => {
                path.push(w.clone());
                i += 1;
                if toks.get(i) == Some(&Tok::Path) {
                    i += 1;
                    continue;
                }
                // `a::b::{self}` names `b`.
                let mut name = match path.as_slice() {
                    [.., parent, last] if last == "self" => Some(parent.clone()),
                    _ => Some(w.clone()),
                };
                if toks.get(i) == Some(&Tok::Ident("as".into())) {
                    if let Some(Tok::Ident(alias)) = toks.get(i + 1) {
                        name = Some(alias.clone());
                    }
                    i += 2;
                }
                out.push((path, name));
                return i;
            }
            Some(Tok::Punct('*')) => {
                out.push((path, None));
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        None => return i,
                        _ => i = use_tree(toks, i, &path, out),
                    }
                }
            }
            _ => {
                if !path.is_empty() {
                    out.push((path, None));
                }
                return i;
            }
        }
    }
}

/// The facts of a file whose module path is `module`.
fn facts(module: &[String], src: &str) -> FileFacts {
    let toks = lex(src);
    let mut f = FileFacts::default();
    // Scope stack: (brace depth at which it opened, module path, is test code).
    let mut scopes: Vec<(usize, Vec<String>, bool)> = vec![(0, module.to_vec(), false)];
    let mut depth = 0usize;
    let mut pending_path: Option<String> = None;
    let mut pending_test = false;
    let mut i = 0;
    let in_test_file = module.iter().any(|m| m == "tests" || m == "testutil");
    while i < toks.len() {
        let (_, scope, test) = scopes.last().cloned().expect("root scope");
        let test = test || in_test_file;
        match &toks[i] {
            Tok::Punct('#') => {
                // Attributes: #[path = ".."], #[cfg(test)].
                let mut j = i + 1;
                if toks.get(j) == Some(&Tok::Punct('!')) {
                    j += 1;
                }
                if toks.get(j) == Some(&Tok::Punct('[')) {
                    let name = toks.get(j + 1);
                    if name == Some(&Tok::Ident("cfg".into()))
                        && toks.get(j + 3) == Some(&Tok::Ident("test".into()))
                    {
                        pending_test = true;
                    }
                    if name == Some(&Tok::Ident("path".into())) {
                        if let Some(Tok::Str(p)) = toks.get(j + 3) {
                            pending_path = Some(p.clone());
                        }
                    }
                    let mut d = 0;
                    while j < toks.len() {
                        match toks[j] {
                            Tok::Punct('[') => d += 1,
                            Tok::Punct(']') => {
                                d -= 1;
                                if d == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    i = j + 1;
                    continue;
                }
                i += 1;
            }
            Tok::Ident(w) if w == "mod" => {
                if let Some(Tok::Ident(name)) = toks.get(i + 1) {
                    let mut path = scope.clone();
                    path.push(name.clone());
                    match toks.get(i + 2) {
                        Some(Tok::Punct(';')) => {
                            f.mods.push((path, pending_path.take()));
                            i += 3;
                        }
                        Some(Tok::Punct('{')) => {
                            depth += 1;
                            f.inline.push(path.clone());
                            scopes.push((depth, path, test || pending_test));
                            i += 3;
                        }
                        _ => i += 1,
                    }
                    pending_test = false;
                    continue;
                }
                i += 1;
            }
            Tok::Ident(w) if w == "use" => {
                let mut paths = Vec::new();
                i = use_tree(&toks, i + 1, &[], &mut paths);
                let test = test || pending_test;
                for (p, name) in paths {
                    if !test {
                        socket_words(&p, &mut f.socket_words);
                    }
                    if let Some(name) = name {
                        f.names.push((scope.clone(), name, p.clone()));
                    }
                    f.uses.push((scope.clone(), p, test));
                }
                pending_test = false;
            }
            Tok::Ident(w) if matches!(w.as_str(), "crate" | "super" | "self") => {
                if toks.get(i + 1) == Some(&Tok::Path) {
                    let mut p = vec![w.clone()];
                    let mut j = i + 1;
                    while toks.get(j) == Some(&Tok::Path) {
                        match toks.get(j + 1) {
                            Some(Tok::Ident(s)) => {
                                p.push(s.clone());
                                j += 2;
                            }
                            _ => break,
                        }
                    }
                    f.uses.push((scope.clone(), p, test));
                    i = j;
                    continue;
                }
                i += 1;
            }
            Tok::Ident(w) => {
                // A path starting with a plain name (not the tail of a longer path).
                if toks.get(i + 1) == Some(&Tok::Path)
                    && (i == 0 || toks[i - 1] != Tok::Path)
                    && w != "libc"
                {
                    let mut p = vec![w.clone()];
                    let mut j = i + 1;
                    while toks.get(j) == Some(&Tok::Path) {
                        match toks.get(j + 1) {
                            Some(Tok::Ident(s)) => {
                                p.push(s.clone());
                                j += 2;
                            }
                            _ => break,
                        }
                    }
                    f.plain.push((scope.clone(), p, test));
                }
                if !test {
                    if SOCKET_WORDS.contains(&w.as_str()) {
                        f.socket_words.insert(w.clone());
                    }
                    if w == "libc" && toks.get(i + 1) == Some(&Tok::Path) {
                        if let Some(Tok::Ident(call)) = toks.get(i + 2) {
                            if LIBC_CALLS.contains(&call.as_str()) {
                                f.socket_words.insert(format!("libc::{call}"));
                            }
                        }
                    }
                }
                i += 1;
            }
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                if scopes.len() > 1 && scopes.last().map(|s| s.0) == Some(depth) {
                    scopes.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Punct(';') => {
                pending_test = false;
                i += 1;
            }
            _ => i += 1,
        }
    }
    f
}

/// Adds the socket words a `use` path names (any segment, or a `libc::` call) to `out`.
fn socket_words(path: &[String], out: &mut BTreeSet<String>) {
    for w in path {
        if SOCKET_WORDS.contains(&w.as_str()) {
            out.insert(w.clone());
        }
    }
    if let [libc, call, ..] = path {
        if libc == "libc" && LIBC_CALLS.contains(&call.as_str()) {
            out.insert(format!("libc::{call}"));
        }
    }
}

/// The crate's files as (path relative to `src/`, module path, text), found by following
/// `mod` declarations from `lib.rs`.
fn module_tree(files: &BTreeMap<String, String>) -> Vec<(String, Vec<String>, FileFacts)> {
    let mut out = Vec::new();
    let mut queue = vec![("lib.rs".to_owned(), Vec::<String>::new())];
    while let Some((file, module)) = queue.pop() {
        let Some(src) = files.get(&file) else {
            continue;
        };
        let f = facts(&module, src);
        // Children of lib.rs and mod.rs live in its directory; of x.rs in x/.
        let dir = match file.rsplit_once('/') {
            Some((d, "mod.rs")) => format!("{d}/"),
            Some((d, name)) => format!("{d}/{}/", name.trim_end_matches(".rs")),
            None if file == "lib.rs" => String::new(),
            None => format!("{}/", file.trim_end_matches(".rs")),
        };
        // `#[path]` is relative to the declaring file's own directory.
        let own_dir = file
            .rsplit_once('/')
            .map_or(String::new(), |(d, _)| format!("{d}/"));
        for (path, attr) in &f.mods {
            let name = path.last().expect("module name");
            // Inline modules between the file and the declaration add directories.
            let inline: Vec<&String> = path[module.len()..path.len() - 1].iter().collect();
            let sub: String = inline.iter().map(|m| format!("{m}/")).collect();
            let child = match attr {
                Some(p) => normalize(&format!("{own_dir}{p}")),
                None => {
                    let a = format!("{dir}{sub}{name}.rs");
                    if files.contains_key(&a) {
                        a
                    } else {
                        format!("{dir}{sub}{name}/mod.rs")
                    }
                }
            };
            queue.push((child, path.clone()));
        }
        out.push((file, module, f));
    }
    out
}

fn normalize(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for s in p.split('/') {
        match s {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            s => parts.push(s),
        }
    }
    parts.join("/")
}

/// What the check found.
#[derive(Debug, Default)]
struct Report {
    /// Import cycles: the files of each strongly connected component, and one cycle through
    /// its first file.
    cycles: Vec<(Vec<String>, Vec<String>)>,
    /// Files outside `sys/` and `io/` naming socket calls, with the words.
    sockets: Vec<(String, Vec<String>)>,
    /// Imports against the stage order: (importing file, imported stage).
    order: Vec<(String, String)>,
    /// The file-level import graph.
    edges: BTreeMap<String, BTreeSet<String>>,
}

/// The absolute module path `path` (used in `scope`) names, or None if it is not a path into
/// the crate. `owner` maps module paths to their files.
fn absolute(
    scope: &[String],
    path: &[String],
    owner: &BTreeMap<Vec<String>, String>,
) -> Option<Vec<String>> {
    let mut abs: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => scope.to_vec(),
        Some("super") => {
            let mut s = scope.to_vec();
            for _ in path.iter().take_while(|s| *s == "super") {
                s.pop();
            }
            s
        }
        Some(first) => {
            let mut child = scope.to_vec();
            child.push(first.to_owned());
            if !owner.contains_key(&child) {
                return None;
            }
            scope.to_vec()
        }
        None => return None,
    };
    abs.extend(
        path.iter()
            .skip_while(|s| matches!(s.as_str(), "crate" | "self" | "super"))
            .filter(|s| *s != "self")
            .cloned(),
    );
    Some(abs)
}

fn check(files: &BTreeMap<String, String>) -> Report {
    let tree = module_tree(files);
    // Module path -> file (inline modules belong to their file).
    let mut owner: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for (file, module, f) in &tree {
        owner.insert(module.clone(), file.clone());
        for m in &f.inline {
            owner.insert(m.clone(), file.clone());
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut report = Report::default();
    for (file, _, f) in &tree {
        let from = edges.entry(file.clone()).or_default();
        // Names `use` gave modules, per scope.
        let mut modules: BTreeMap<(&[String], &str), Vec<String>> = BTreeMap::new();
        for (scope, name, path) in &f.names {
            if let Some(abs) = absolute(scope, path, &owner) {
                if owner.contains_key(&abs) {
                    modules.insert((scope, name), abs);
                }
            }
        }
        let plain = f.plain.iter().filter_map(|(scope, path, _)| {
            let first = path.first()?;
            match modules.get(&(scope.as_slice(), first.as_str())) {
                Some(m) => Some(m.iter().chain(&path[1..]).cloned().collect()),
                None => absolute(scope, path, &owner),
            }
        });
        let used = f
            .uses
            .iter()
            .filter_map(|(scope, path, _)| absolute(scope, path, &owner));
        for abs in used.chain(plain) {
            let target = (0..=abs.len())
                .rev()
                .find_map(|n| owner.get(&abs[..n]))
                .cloned();
            if let Some(t) = target {
                if &t != file {
                    from.insert(t);
                }
            }
        }
        let io = IO_DIRS.iter().any(|d| file.starts_with(d));
        if !io && !f.socket_words.is_empty() {
            report
                .sockets
                .push((file.clone(), f.socket_words.iter().cloned().collect()));
        }
    }
    let test_file = |f: &str| f.contains("tests") || f == "testutil.rs";
    for (from, tos) in &edges {
        if RUNNERS.contains(&from.as_str()) || test_file(from) {
            continue;
        }
        let rank = STAGES.iter().position(|s| s == from);
        for to in tos {
            let Some(target) = STAGES.iter().position(|s| s == to) else {
                continue;
            };
            if rank.is_none_or(|r| target >= r) {
                report.order.push((from.clone(), to.clone()));
            }
        }
    }
    report.cycles = cycles(&edges);
    report.edges = edges;
    report
}

/// The strongly connected components of more than one file (Tarjan), each with a cycle
/// through its first file.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<(Vec<String>, Vec<String>)> {
    struct St<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(st: &mut St<'a>, v: &'a str) {
        st.index.insert(v, st.next);
        st.low.insert(v, st.next);
        st.next += 1;
        st.stack.push(v);
        st.on.insert(v);
        if let Some(ws) = st.edges.get(v) {
            for w in ws {
                let w = w.as_str();
                if !st.index.contains_key(w) {
                    visit(st, w);
                    let l = st.low[w].min(st.low[v]);
                    st.low.insert(v, l);
                } else if st.on.contains(w) {
                    let l = st.index[w].min(st.low[v]);
                    st.low.insert(v, l);
                }
            }
        }
        if st.low[v] == st.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on.remove(w);
                comp.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                st.out.push(comp);
            }
        }
    }
    let mut st = St {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !st.index.contains_key(v.as_str()) {
            visit(&mut st, v);
        }
    }
    st.out
        .into_iter()
        .map(|comp| {
            let example = cycle_through(edges, &comp);
            (comp, example)
        })
        .collect()
}

/// A cycle from the first file of `comp` back to it (breadth-first, inside `comp`).
fn cycle_through(edges: &BTreeMap<String, BTreeSet<String>>, comp: &[String]) -> Vec<String> {
    let start = &comp[0];
    let inside: BTreeSet<&String> = comp.iter().collect();
    let mut prev: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in edges.get(v).into_iter().flatten() {
            if w == start {
                let mut path = vec![v.clone()];
                let mut at = v;
                while at != start {
                    at = prev[at];
                    path.push(at.clone());
                }
                path.reverse();
                path.push(start.clone());
                return path;
            }
            if inside.contains(w) && !prev.contains_key(w) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    comp.to_vec()
}

fn read_tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let entries = std::fs::read_dir(dir).expect("source directory");
        for e in entries {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(root, &p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p
                    .strip_prefix(root)
                    .expect("under root")
                    .to_string_lossy()
                    .replace('\\', "/");
                out.insert(rel, std::fs::read_to_string(&p).expect("source file"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn the_data_plane_has_no_import_cycle_and_only_io_touches_sockets() {
    let dir = std::env::var_os("LAYERING_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let files = read_tree(&dir);
    let tree = module_tree(&files);
    assert!(
        tree.len() > 30,
        "only {} files reached from lib.rs in {}",
        tree.len(),
        dir.display()
    );
    let report = check(&files);
    let edges: usize = report.edges.values().map(BTreeSet::len).sum();
    assert!(edges > 30, "only {edges} imports found: {:?}", report.edges);
    assert!(
        report
            .edges
            .get("pipeline/graph.rs")
            .is_some_and(|to| to.contains("pipeline/seal.rs")),
        "the known import pipeline/graph.rs -> pipeline/seal.rs is missing: {:?}",
        report.edges.get("pipeline/graph.rs")
    );
    let mut problems = Vec::new();
    for (comp, example) in &report.cycles {
        problems.push(format!(
            "import cycle among {} files ({}), e.g. {}",
            comp.len(),
            comp.join(", "),
            example.join(" -> ")
        ));
    }
    for (file, words) in &report.sockets {
        problems.push(format!(
            "{file} touches sockets ({}) outside sys/ and io/",
            words.join(", ")
        ));
    }
    for (from, to) in &report.order {
        problems.push(format!(
            "{from} imports the stage {to}, which is not an earlier stage"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn files(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(p, s)| ((*p).to_owned(), (*s).to_owned()))
        .collect()
}

#[test]
fn a_cycle_is_found_and_named() {
    let f = files(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "use crate::b::{self, B};\npub struct A;\n"),
        ("b.rs", "pub struct B;\nfn f() { crate::c::g(); }\n"),
        // `super::` from an inline module, a string and a comment that name `crate::a`.
        (
            "c.rs",
            "// crate::b::B\nconst S: &str = \"crate::b\";\npub fn g() {}\nmod inner {\n    use super::super::a::A;\n}\n",
        ),
    ]);
    let r = check(&f);
    let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        r.cycles,
        vec![(
            names(&["a.rs", "b.rs", "c.rs"]),
            names(&["a.rs", "b.rs", "c.rs", "a.rs"])
        )]
    );
    // A child using its parent's items is not a cycle; neither is a test module.
    let f = files(&[
        ("lib.rs", "mod a;\n"),
        ("a.rs", "mod b;\npub struct A;\n#[cfg(test)]\nmod tests;\n"),
        ("a/b.rs", "use super::A;\n"),
        ("a/tests.rs", "use super::*;\nuse std::net::UdpSocket;\n"),
    ]);
    let r = check(&f);
    assert!(r.cycles.is_empty(), "{:?}", r.cycles);
    assert!(r.sockets.is_empty(), "{:?}", r.sockets);
}

#[test]
fn a_stage_importing_a_later_one_is_found() {
    let f = files(&[
        ("lib.rs", "mod pipeline;\nmod tables;\n"),
        (
            "pipeline/mod.rs",
            "mod classify;\nmod open;\nmod seal;\nmod graph;\n",
        ),
        ("pipeline/classify.rs", "use super::open::Opened;\n"),
        ("pipeline/open.rs", "pub struct Opened;\n"),
        ("pipeline/seal.rs", "use super::open::Opened;\n"),
        ("pipeline/graph.rs", "use super::{classify, open, seal};\n"),
        ("tables.rs", "fn f() { crate::pipeline::seal::queue(); }\n"),
    ]);
    let r = check(&f);
    assert!(r.cycles.is_empty(), "{:?}", r.cycles);
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        r.order,
        vec![
            pair("pipeline/classify.rs", "pipeline/open.rs"),
            pair("tables.rs", "pipeline/seal.rs"),
        ]
    );
}

#[test]
fn sockets_outside_io_are_found() {
    let f = files(&[
        ("lib.rs", "mod io;\nmod sys;\nmod stage;\n"),
        ("io/mod.rs", "fn r(s: &netio::UdpSocket) { s.recv_batch(); }\n"),
        ("sys/mod.rs", "fn w() { unsafe { libc::sendmmsg(0) }; }\n"),
        (
            "stage.rs",
            "fn s(sock: &Sock) { sock.send_to(&[], a); let _ = unsafe { libc::socket(1, 2, 3) }; }\n#[cfg(test)]\nmod tests {\n    fn t() { std::net::UdpSocket::bind(\"x\"); }\n}\n",
        ),
    ]);
    let r = check(&f);
    assert_eq!(
        r.sockets,
        vec![(
            "stage.rs".to_owned(),
            vec!["libc::socket".to_owned(), "send_to".to_owned()]
        )]
    );
}

#[test]
fn a_cycle_through_a_module_name_given_by_use_is_found() {
    for (user, what) in [
        (
            "use crate::pipeline;\nfn f() { pipeline::seal::queue(); }\n",
            "module imported whole",
        ),
        (
            "use crate::pipeline as p;\nfn f() { p::seal::queue(); }\n",
            "module renamed",
        ),
        (
            "use crate::pipeline::{self};\nfn f() { pipeline::seal::queue(); }\n",
            "module imported as self",
        ),
    ] {
        let f = files(&[
            ("lib.rs", "mod pipeline;\nmod tables;\n"),
            ("pipeline/mod.rs", "pub mod seal;\n"),
            (
                "pipeline/seal.rs",
                "use crate::tables::Tables;\npub fn queue() {}\n",
            ),
            ("tables.rs", user),
        ]);
        let r = check(&f);
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            r.cycles,
            vec![(
                names(&["pipeline/seal.rs", "tables.rs"]),
                names(&["pipeline/seal.rs", "tables.rs", "pipeline/seal.rs"])
            )],
            "{what}"
        );
    }
    // A local item that shares a module's name is no import.
    let f = files(&[
        ("lib.rs", "mod pipeline;\nmod tables;\n"),
        ("pipeline/mod.rs", "pub mod seal;\n"),
        (
            "pipeline/seal.rs",
            "use crate::tables::Tables;\npub fn queue() {}\n",
        ),
        ("tables.rs", "fn f() { seal::queue(); }\n"),
    ]);
    assert!(check(&f).cycles.is_empty());
}

#[test]
fn a_socket_type_renamed_by_use_is_found() {
    let f = files(&[
        ("lib.rs", "mod stage;\nmod other;\n"),
        ("stage.rs", "use netio::UdpSocket as S;\nfn s(x: &S) {}\n"),
        (
            "other.rs",
            "use libc::{sendmmsg as go, c_int};\nfn t() {}\n",
        ),
    ]);
    let r = check(&f);
    assert_eq!(
        r.sockets,
        vec![
            (
                "other.rs".to_owned(),
                vec!["libc::sendmmsg".to_owned(), "sendmmsg".to_owned()]
            ),
            ("stage.rs".to_owned(), vec!["UdpSocket".to_owned()]),
        ]
    );
}
