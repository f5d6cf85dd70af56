//! The architecture, checked against ARCHITECTURE.md ("Dependency rules"):
//!
//! - no file under `src/` has more than 1,000 lines;
//! - each module uses only the crate modules its row of the table allows, or
//!   an arrow the "Exceptions today" list names, and none of the crates
//!   (`tokio`, `hyper`) its row says never; the rows themselves form no cycle;
//! - no file of `engine/` or `http/` imports one that imports it back, unless
//!   the cycle runs through an arrow between two files the list names.
//!
//! The table and the list are read from ARCHITECTURE.md, so document and test
//! cannot drift apart: a new arrow or cycle fails, and so does a listed
//! exception that no longer occurs.
//!
//! Sources are scanned, not compiled. Comments and the insides of string and
//! character literals are blanked first; then every path is read whole
//! (`crate::job::Job`, `super::state::State`, a `use crate::{clock::Millis,
//! job}` group across lines), together with the inline modules around it
//! (`mod tests { .. }`), which decide what `super::` means.
//!
//! Between the files of a directory module:
//! - `mod.rs` is the module root. A child naming `super::X` depends on the
//!   child `mod.rs` imports `X` from (a re-export only passes it through), or
//!   else on `mod.rs` itself, where `X` is defined. A `use child::X` in
//!   `mod.rs` makes `mod.rs` depend on `child` only where the rest of `mod.rs`
//!   names `X`: a root that just re-exports its children closes no cycle; one
//!   whose own code calls a child that builds on the root's items does.
//! - A `#[cfg(test)]` module is outside the layering: unit tests may build
//!   their fixtures from any sibling. They still count for the table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The most lines a source file may have.
const LINES_MAX: usize = 1_000;
/// Where the modules behind the binary are declared (see `lib.rs`).
const PRIVATE: &str = "__private.rs";
/// Directory modules whose files must not import each other in a cycle.
const LAYERED: [&str; 2] = ["engine", "http"];
/// The external crates a row's "never" column can name, and this test checks.
const CHECKED_CRATES: [&str; 2] = ["tokio", "hyper"];

/// Source files by path under `src/` (`engine/state.rs`), with their text.
type Sources = BTreeMap<String, String>;

/// Who uses whom, with the first line that does: files or modules.
type Graph = BTreeMap<String, BTreeMap<String, usize>>;

#[test]
fn no_source_file_passes_the_line_bound() {
    let problems = long_files(&read_sources(), LINES_MAX);
    assert!(problems.is_empty(), "split these files by responsibility:\n{}", problems.join("\n"));
}

#[test]
fn modules_use_only_what_their_row_allows() {
    let problems = dependency_problems(&read_sources(), &architecture());
    assert!(problems.is_empty(), "against the dependency rules in ARCHITECTURE.md:\n{}", problems.join("\n"));
}

#[test]
fn no_file_of_a_layered_module_imports_one_that_imports_it_back() {
    let problems = cycle_problems(&read_sources(), &architecture(), &LAYERED);
    assert!(problems.is_empty(), "import cycles between files:\n{}", problems.join("\n"));
}

fn read_sources() -> Sources {
    fn walk(root: &Path, dir: &Path, sources: &mut Sources) {
        for entry in std::fs::read_dir(dir).expect("src/ reads") {
            let path = entry.expect("a directory entry reads").path();
            if path.is_dir() {
                walk(root, &path, sources);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let relative = path.strip_prefix(root).expect("under src/").to_string_lossy().replace('\\', "/");
                sources.insert(relative, std::fs::read_to_string(&path).expect("a source file reads"));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = Sources::new();
    walk(&root, &root, &mut sources);
    sources
}

fn architecture() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
        .expect("ARCHITECTURE.md reads")
}

fn long_files(sources: &Sources, max: usize) -> Vec<String> {
    sources
        .iter()
        .map(|(path, text)| (path, text.lines().count()))
        .filter(|&(_, lines)| lines > max)
        .map(|(path, lines)| format!("src/{path}: {lines} lines, more than {max}"))
        .collect()
}

// ---- The rules, as ARCHITECTURE.md states them ----

/// The "Dependency rules" section of ARCHITECTURE.md.
#[derive(Debug, Default)]
struct Rules {
    /// Per row (a module, `main.rs` or `lib.rs`): the modules it may use.
    may_use: BTreeMap<String, BTreeSet<String>>,
    /// Per row: the checked crates it must never use.
    never: BTreeMap<String, BTreeSet<String>>,
    /// Known exceptions between modules, `from` → `to`.
    module_arrows: BTreeSet<(String, String)>,
    /// Known arrows closing a cycle between files, `engine/a.rs` → `engine/b.rs`.
    file_arrows: BTreeSet<(String, String)>,
    /// What cannot be read as a rule.
    problems: Vec<String>,
}

impl Rules {
    fn parse(document: &str) -> Rules {
        let mut rules = Rules::default();
        let section: Vec<&str> = document
            .lines()
            .skip_while(|line| line.trim() != "## Dependency rules")
            .skip(1)
            .take_while(|line| !line.starts_with("## "))
            .collect();
        for line in &section {
            let line = line.trim();
            if let Some(row) = line.strip_prefix('|') {
                rules.parse_row(row);
            } else if let Some(item) = line.strip_prefix("- ") {
                rules.parse_exception(item);
            }
        }
        if rules.may_use.is_empty() {
            rules.problems.push("ARCHITECTURE.md: no table under \"## Dependency rules\"".into());
        }
        rules
    }

    /// `| module(s) | may use | never |`: the first backticked word of each
    /// "may use" item names a module; items without one are crates or prose.
    fn parse_row(&mut self, row: &str) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        if cells.len() < 3 || cells[0] == "module" || cells[0].starts_with("---") {
            return;
        }
        let keys = backticked(cells[0]);
        if keys.is_empty() {
            self.problems.push(format!("ARCHITECTURE.md: a dependency row names no module: |{row}"));
        }
        let may: BTreeSet<String> =
            split_items(cells[1], &[',']).iter().filter_map(|item| backticked(item).into_iter().next()).collect();
        let never: BTreeSet<String> = split_items(cells[2], &[',', ';'])
            .iter()
            .filter_map(|item| item.split_whitespace().next().map(|word| word.trim_matches('`').to_string()))
            .filter(|word| CHECKED_CRATES.contains(&word.as_str()))
            .collect();
        for key in keys {
            let key = key.trim_end_matches('/').to_string();
            if self.may_use.insert(key.clone(), may.clone()).is_some() {
                self.problems.push(format!("ARCHITECTURE.md: two dependency rows for `{key}`"));
            }
            self.never.insert(key, never.clone());
        }
    }

    /// `` - `from` → `to`: why ``, between modules or (paths under `src/`)
    /// between files.
    fn parse_exception(&mut self, item: &str) {
        let Some((from, to)) = item.split_once('→') else { return };
        let (from, to) = (backticked(from), backticked(to));
        let (Some(from), Some(to)) = (from.last(), to.first()) else {
            self.problems.push(format!("ARCHITECTURE.md: an exception not of the form `from` → `to`: {item}"));
            return;
        };
        let arrow = (from.clone(), to.clone());
        if from.contains('/') || to.contains('/') {
            self.file_arrows.insert(arrow);
        } else {
            self.module_arrows.insert(arrow);
        }
    }
}

/// The words in backticks, in order.
fn backticked(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// `text` split at `separators` outside parentheses.
fn split_items(text: &str, separators: &[char]) -> Vec<String> {
    let mut items = vec![String::new()];
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 && separators.contains(&c) => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        items.last_mut().expect("never empty").push(c);
    }
    items.into_iter().map(|item| item.trim().to_string()).filter(|item| !item.is_empty()).collect()
}

// ---- Reading the sources ----

/// `text` with comments and the insides of string and character literals
/// replaced by spaces. Line breaks stay, so an offset keeps its line.
fn blank(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let clear = |out: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut out[from..to.min(b.len())] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let ident_before = i > 0 && is_ident(b[i - 1]);
        if b[i..].starts_with(b"//") {
            let end = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |n| i + n);
            clear(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut end) = (0usize, i);
            while end < b.len() {
                if b[end..].starts_with(b"/*") {
                    depth += 1;
                    end += 2;
                } else if b[end..].starts_with(b"*/") {
                    depth -= 1;
                    end += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    end += 1;
                }
            }
            clear(&mut out, i, end);
            i = end;
        } else if b[i] == b'r' && (!ident_before || is_byte_prefix(b, i)) && matches!(b.get(i + 1), Some(b'"' | b'#')) {
            // A raw string: r"..", r#".."#, br##".."##.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            let open = i + 1 + hashes;
            if b.get(open) != Some(&b'"') {
                i += 1;
                continue;
            }
            let mut close = open + 1;
            while close < b.len() && !(b[close] == b'"' && b[close + 1..].iter().take(hashes).all(|&c| c == b'#')) {
                close += 1;
            }
            clear(&mut out, open + 1, close);
            i = close + 1 + hashes;
        } else if b[i] == b'"' {
            let mut close = i + 1;
            while close < b.len() && b[close] != b'"' {
                close += if b[close] == b'\\' { 2 } else { 1 };
            }
            clear(&mut out, i + 1, close);
            i = close + 1;
        } else if b[i] == b'\'' && (!ident_before || is_byte_prefix(b, i)) {
            // A character literal ('x', b'"', '\n', '\u{..}'), or else a lifetime.
            let close = if b.get(i + 1) == Some(&b'\\') {
                b.get(i + 3..).and_then(|rest| rest.iter().position(|&c| c == b'\'')).map(|n| i + 3 + n)
            } else {
                let width = text.get(i + 1..).and_then(|rest| rest.chars().next()).map_or(1, char::len_utf8);
                (b.get(i + 1 + width) == Some(&b'\'')).then_some(i + 1 + width)
            };
            match close {
                Some(close) => {
                    clear(&mut out, i + 1, close);
                    i = close + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Whether the `b` before offset `i` makes a byte literal (`b'x'`, `b"x"`).
fn is_byte_prefix(b: &[u8], i: usize) -> bool {
    i >= 1 && b[i - 1] == b'b' && (i < 2 || !is_ident(b[i - 2]))
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// One path a file names; a `use` group's items each on their own.
#[derive(Debug)]
struct PathRef {
    /// 1-based line of its last segment.
    line: usize,
    /// `["super", "state", "State"]`; a glob ends in `"*"`.
    segments: Vec<String>,
    /// The name a `use` brings it in as, when that is not its last segment.
    alias: Option<String>,
    /// Whether it is (part of) a `use` declaration.
    in_use: bool,
    /// How many inline modules (`mod tests { .. }`) it sits in.
    depth: usize,
    /// Whether one of them is `#[cfg(test)]`.
    in_test: bool,
}

impl PathRef {
    /// The name a `use` of this path brings into scope.
    fn imported_name(&self) -> &str {
        self.alias.as_deref().unwrap_or_else(|| self.segments.last().expect("never empty"))
    }
}

/// A source file, scanned.
struct File {
    /// Every path of two or more segments.
    paths: Vec<PathRef>,
    /// The identifiers outside `use` declarations and test modules.
    idents: BTreeSet<String>,
}

fn scan(text: &str) -> File {
    let code = blank(text);
    let mut paths = Vec::new();
    let mut idents = BTreeSet::new();
    let mut braces = 0usize;
    // For each inline module around: the brace depth it opened at, and
    // whether it is a test module.
    let mut inline_modules: Vec<(usize, bool)> = Vec::new();
    let mut item_start = 0;
    let mut previous = String::new();
    let mut in_use = false;
    let mut i = 0;
    while i < code.len() {
        let c = code[i];
        match c {
            b'{' => braces += 1,
            b'}' => {
                braces = braces.saturating_sub(1);
                if inline_modules.last().is_some_and(|&(opened, _)| opened == braces) {
                    inline_modules.pop();
                }
            }
            b';' => in_use = false,
            _ => {}
        }
        if matches!(c, b'{' | b'}' | b';') {
            item_start = i + 1;
        }
        if !(c.is_ascii_alphabetic() || c == b'_') || (i > 0 && is_ident(code[i - 1])) {
            i += 1;
            continue;
        }
        let in_test = inline_modules.iter().any(|&(_, test)| test);
        let (word, end) = ident_at(&code, i);
        if word == "use" {
            in_use = true;
        } else if !in_use && !in_test {
            idents.insert(word.clone());
        }
        let after_colons = i >= 2 && &code[i - 2..i] == b"::";
        if code[end..].starts_with(b"::") && !after_colons {
            let mut found = Vec::new();
            let end = parse_path(&code, i, Vec::new(), &mut found);
            for (at, segments, alias) in found {
                if !in_use && !in_test {
                    idents.extend(segments.iter().cloned());
                }
                let line = code[..at].iter().filter(|&&c| c == b'\n').count() + 1;
                paths.push(PathRef { line, segments, alias, in_use, depth: inline_modules.len(), in_test });
            }
            previous.clear();
            i = end;
            continue;
        }
        if previous == "mod" && code[end..].iter().find(|c| !c.is_ascii_whitespace()) == Some(&b'{') {
            let attributes = String::from_utf8_lossy(&code[item_start..i]).replace(char::is_whitespace, "");
            inline_modules.push((braces, in_test || attributes.contains("#[cfg(test)]")));
        }
        previous = word;
        i = end;
    }
    File { paths, idents }
}

fn ident_at(code: &[u8], start: usize) -> (String, usize) {
    let end = start + code[start..].iter().take_while(|&&c| is_ident(c)).count();
    (String::from_utf8_lossy(&code[start..end]).into_owned(), end)
}

fn skip_space(code: &[u8], mut i: usize) -> usize {
    while i < code.len() && code[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Reads the path at `i` after `prefix`, expanding `{..}` groups: pushes
/// (offset, segments, alias) for each path it names; returns where it ends.
fn parse_path(
    code: &[u8],
    mut i: usize,
    mut prefix: Vec<String>,
    found: &mut Vec<(usize, Vec<String>, Option<String>)>,
) -> usize {
    loop {
        match code.get(i) {
            Some(b'{') => {
                i += 1;
                loop {
                    i = skip_space(code, i);
                    match code.get(i) {
                        None => return i,
                        Some(b'}') => return i + 1,
                        Some(&c) if is_ident(c) || c == b'*' || c == b'{' => {
                            i = parse_path(code, i, prefix.clone(), found);
                        }
                        Some(_) => i += 1,
                    }
                }
            }
            Some(b'*') => {
                prefix.push("*".into());
                found.push((i, prefix, None));
                return i + 1;
            }
            Some(&c) if is_ident(c) => {
                let (word, end) = ident_at(code, i);
                prefix.push(word);
                if code[end..].starts_with(b"::")
                    && code.get(end + 2).is_some_and(|&c| is_ident(c) || c == b'{' || c == b'*')
                {
                    i = end + 2;
                    continue;
                }
                let after = skip_space(code, end);
                if code[after..].starts_with(b"as") && code.get(after + 2).is_some_and(u8::is_ascii_whitespace) {
                    let (alias, alias_end) = ident_at(code, skip_space(code, after + 2));
                    if !alias.is_empty() {
                        found.push((i, prefix, Some(alias)));
                        return alias_end;
                    }
                }
                found.push((i, prefix, None));
                return end;
            }
            _ => {
                if prefix.len() > 1 {
                    found.push((i, prefix, None));
                }
                return i;
            }
        }
    }
}

fn scan_all(sources: &Sources) -> BTreeMap<&str, File> {
    sources.iter().map(|(path, text)| (path.as_str(), scan(text))).collect()
}

/// The modules in files of their own a crate root declares (`mod x;`).
fn declared_modules(root: Option<&String>) -> BTreeSet<String> {
    let Some(root) = root else { return BTreeSet::new() };
    let code = blank(root);
    String::from_utf8_lossy(&code)
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.iter().position(|&word| word == "mod")?;
            Some(words.get(at + 1)?.strip_suffix(';')?.to_string())
        })
        .collect()
}

/// The strongly connected components of more than one node.
fn cycles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let reachable: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|node| (node, reachable(graph, node))).collect();
    let mut components: Vec<BTreeSet<String>> = Vec::new();
    for (&node, reached) in &reachable {
        if !reached.contains(node) || components.iter().any(|component| component.contains(node)) {
            continue;
        }
        let reaches_back = |other: &&String| reachable.get(*other).is_some_and(|back| back.contains(node));
        let component: BTreeSet<String> = reached.iter().filter(reaches_back).cloned().collect();
        if component.len() > 1 {
            components.push(component);
        }
    }
    components
}

/// Every node reachable from `from` by one arrow or more.
fn reachable(graph: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_string()];
    while let Some(node) = stack.pop() {
        for next in graph.get(&node).into_iter().flat_map(BTreeMap::keys) {
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    seen
}

/// A cycle's arrows, for a message: "src/a.rs:3 uses b, ..".
fn describe(graph: &Graph, component: &BTreeSet<String>, prefix: &str) -> String {
    let mut arrows = Vec::new();
    for from in component {
        for (to, line) in graph[from].iter().filter(|(to, _)| component.contains(*to)) {
            arrows.push(format!("{prefix}{from}:{line} uses `{to}`"));
        }
    }
    arrows.join("; ")
}

// ---- Dependencies between top-level modules ----

/// The row a file falls under: `engine` for `engine/state.rs`, `limits` for
/// `limits.rs`; the crate roots are rows of their own.
fn module_of(path: &str) -> &str {
    match path.split_once('/') {
        Some((directory, _)) => directory,
        None if path == "main.rs" || path == "lib.rs" => path,
        None => path.trim_end_matches(".rs"),
    }
}

fn dependency_problems(sources: &Sources, document: &str) -> Vec<String> {
    let rules = Rules::parse(document);
    let mut problems = rules.problems.clone();
    // The modules behind the binary are declared in `__private.rs` and
    // named from the crate root as the others are (`crate::http`).
    let mut library = declared_modules(sources.get("lib.rs"));
    library.extend(declared_modules(sources.get(PRIVATE)));
    library.remove("__private");
    let binary = declared_modules(sources.get("main.rs"));
    let known = |name: &str| library.contains(name) || binary.contains(name) || name == "main.rs" || name == "lib.rs";

    let mut table = Graph::new();
    for (row, allowed) in &rules.may_use {
        if !known(row) {
            problems.push(format!("ARCHITECTURE.md: a row for `{row}`, which is no module of src/"));
        }
        for name in allowed.iter().filter(|name| !known(name)) {
            problems.push(format!("ARCHITECTURE.md: `{row}` may use `{name}`, which is no module of src/"));
        }
        table.insert(row.clone(), allowed.iter().map(|name| (name.clone(), 0)).collect());
    }
    for component in cycles(&table) {
        let rows: Vec<String> = component.iter().map(|row| format!("`{row}`")).collect();
        problems.push(format!(
            "ARCHITECTURE.md: the rows of {} may use each other in a cycle; list the arrow against the layering \
             as an exception instead",
            rows.join(", ")
        ));
    }
    for (from, to) in &rules.module_arrows {
        if !known(from) || !known(to) {
            problems.push(format!("ARCHITECTURE.md: exception `{from}` → `{to}` names no module of src/"));
        }
    }

    let mut arrows_seen = BTreeSet::new();
    let mut rows_missing = BTreeSet::new();
    let mut reported = BTreeSet::new();
    for (&path, file) in &scan_all(sources) {
        if path == PRIVATE {
            continue;
        }
        let module = module_of(path);
        let Some(allowed) = rules.may_use.get(module) else {
            rows_missing.insert(module);
            continue;
        };
        let never = &rules.never[module];
        let own = if path == "main.rs" || binary.contains(module) { &binary } else { &library };
        // How many `super`s reach the crate root from the file's top level:
        // `limits.rs` 1, `engine/mod.rs` 1, `engine/state/read.rs` 3.
        let levels = match path {
            "main.rs" | "lib.rs" => 0,
            _ => path.split('/').count() - usize::from(path.ends_with("/mod.rs")),
        };
        for reference in &file.paths {
            // `svc::__private::http::X` and `crate::__private::http` name `http`.
            let mut segments = reference.segments.clone();
            if segments.get(1).is_some_and(|segment| segment == "__private") {
                segments.remove(1);
            }
            let segments = &segments;
            let supers = segments.iter().take_while(|&segment| segment == "super").count();
            let target = match segments[0].as_str() {
                "crate" => segments.get(1).filter(|name| own.contains(*name)),
                "svc" => segments.get(1).filter(|name| library.contains(*name)),
                "super" if supers == levels + reference.depth => {
                    segments.get(supers).filter(|name| own.contains(*name))
                }
                name if levels == 0 && reference.depth == 0 && own.contains(name) => Some(&segments[0]),
                name if never.contains(name) => {
                    problems.push(format!(
                        "src/{path}:{}: `{module}` uses `{name}`, which its row says it never does",
                        reference.line
                    ));
                    None
                }
                _ => None,
            };
            let Some(target) = target.map(String::as_str) else { continue };
            if target == module || allowed.contains(target) {
                continue;
            }
            let arrow = (module.to_string(), target.to_string());
            if rules.module_arrows.contains(&arrow) {
                arrows_seen.insert(arrow);
            } else if reported.insert((path, reference.line, target.to_string())) {
                problems.push(format!(
                    "src/{path}:{}: `{module}` uses `{target}` (`{}`), which its row does not allow",
                    reference.line,
                    segments.join("::")
                ));
            }
        }
    }
    for module in rows_missing {
        problems.push(format!("ARCHITECTURE.md: the dependency table has no row for `{module}`"));
    }
    for (from, to) in rules.module_arrows.difference(&arrows_seen) {
        problems.push(format!("ARCHITECTURE.md: exception `{from}` → `{to}` no longer occurs; remove it"));
    }
    problems
}

// ---- Cycles between the files of a directory module ----

/// Which file of `src/<module>/` uses which other, with the first line that
/// does: `engine/state.rs` → {`engine/record.rs`: 15, ..}. Every file is a
/// node, those of a child's own folder too (a feature folder's record
/// payloads sit below the files that use them); a path names the deepest
/// file it reaches (`super::progress::record::X`: `engine/progress/record.rs`).
/// Test modules are left out.
fn file_graph(files: &BTreeMap<&str, File>, module: &str) -> Graph {
    let prefix = format!("{module}/");
    let root = format!("{module}/mod.rs");
    let child_of = |path: &str| -> Option<String> {
        let rest = path.strip_prefix(&prefix).filter(|rest| *rest != "mod.rs")?;
        rest.split('/').next().map(|first| first.trim_end_matches(".rs").to_string())
    };
    let children: BTreeSet<String> = files.keys().filter_map(|path| child_of(path)).collect();
    // The deepest file `segments` (from the module root) name.
    let node = |segments: &[String]| -> String {
        let mut dir = module.to_string();
        let mut found = None;
        for segment in segments {
            let file = format!("{dir}/{segment}.rs");
            let folder = format!("{dir}/{segment}/mod.rs");
            if files.contains_key(file.as_str()) {
                found = Some(file);
            } else if files.contains_key(folder.as_str()) {
                found = Some(folder);
            } else {
                break;
            }
            dir = format!("{dir}/{segment}");
        }
        found.unwrap_or_else(|| format!("{prefix}{}/mod.rs", segments[0]))
    };
    // What `mod.rs` imports from its children, by the name it goes by there.
    let mut imported_from: BTreeMap<&str, &[String]> = BTreeMap::new();
    if let Some(file) = files.get(root.as_str()) {
        for reference in file.paths.iter().filter(|reference| reference.in_use && reference.depth == 0) {
            let rest = relative(module, &reference.segments, 0, &children);
            if let Some(rest) = rest.filter(|rest| rest.first().is_some_and(|child| children.contains(child))) {
                imported_from.insert(reference.imported_name(), rest);
            }
        }
    }

    let mut graph = Graph::new();
    for (&path, file) in files.iter().filter(|(path, _)| path.starts_with(&prefix)) {
        let is_root = path == root;
        let from = path.to_string();
        // How far the file's top level sits below the module root: `a.rs` 1,
        // `a/b.rs` 2, `a/mod.rs` 1.
        let rest = &path[prefix.len()..];
        let below = if is_root { 0 } else { rest.matches('/').count() + usize::from(!rest.ends_with("/mod.rs")) };
        let arrows = graph.entry(from.clone()).or_default();
        for reference in file.paths.iter().filter(|reference| !reference.in_test) {
            let supers = below + reference.depth;
            let Some(segments) = relative(module, &reference.segments, supers, &children) else { continue };
            let Some(first) = segments.first() else { continue };
            let target = if children.contains(first) {
                // An import in mod.rs counts where mod.rs's own code names it.
                if is_root && reference.in_use && !file.idents.contains(reference.imported_name()) {
                    continue;
                }
                node(segments)
            } else if first == "self" {
                continue;
            } else {
                match imported_from.get(first.as_str()) {
                    Some(child) => node(child),
                    None => root.clone(),
                }
            };
            if target != from {
                arrows.entry(target).or_insert(reference.line);
            }
        }
    }
    graph
}

/// The part of `segments` after the module root, when they start there:
/// `crate::<module>::`, or `supers` times `super::` (where `supers` is 0, in
/// `mod.rs` at its top level, also `self::` or a child's name).
fn relative<'a>(
    module: &str,
    segments: &'a [String],
    supers: usize,
    children: &BTreeSet<String>,
) -> Option<&'a [String]> {
    if segments.len() > 1 && segments[0] == "crate" && segments[1] == module {
        return Some(&segments[2..]);
    }
    let leading = segments.iter().take_while(|&segment| segment == "super").count();
    match leading {
        0 if supers == 0 && segments[0] == "self" => Some(&segments[1..]),
        0 if supers == 0 && children.contains(&segments[0]) => Some(segments),
        0 => None,
        _ => (leading == supers).then(|| &segments[leading..]),
    }
}

fn cycle_problems(sources: &Sources, document: &str, layered: &[&str]) -> Vec<String> {
    let rules = Rules::parse(document);
    let mut problems = rules.problems.clone();
    let files = scan_all(sources);
    let mut arrows_seen = BTreeSet::new();
    for module in layered {
        let graph = file_graph(&files, module);
        let mut layers = graph.clone();
        for (from, to) in &rules.file_arrows {
            let closes_a_cycle =
                graph.get(from).is_some_and(|arrows| arrows.contains_key(to)) && reachable(&graph, to).contains(from);
            if closes_a_cycle {
                arrows_seen.insert((from.clone(), to.clone()));
                layers.get_mut(from).expect("in the graph").remove(to);
            }
        }
        for component in cycles(&layers) {
            let files: Vec<String> = component.iter().map(|file| format!("`{file}`")).collect();
            problems.push(format!("a cycle between {}: {}", files.join(", "), describe(&layers, &component, "src/")));
        }
    }
    for (from, to) in rules.file_arrows.difference(&arrows_seen) {
        problems.push(format!("ARCHITECTURE.md: exception `{from}` → `{to}` closes no cycle any more; remove it"));
    }
    problems
}

// ---- The checker itself, on sources made up to break each rule ----

mod checker {
    use super::*;

    const RULES: &str = "\
# x

## Dependency rules

| module | may use | never |
|---|---|---|
| `base` | std | anything else, `tokio` |
| `mid`, `side` | `base` (`Thing`, `Other`), serde | hyper |
| `top` | `mid`, `side`, `base` | |
| `lib.rs` | `top` | |

Exceptions today:
- `side` → `top`: known.
- `top/mod.rs` → `top/b.rs`: known.
- `side` → `mid`: stale.

## Next section
";

    fn sources(files: &[(&str, &str)]) -> Sources {
        files.iter().map(|(path, text)| (path.to_string(), text.to_string())).collect()
    }

    fn lib() -> (&'static str, &'static str) {
        ("lib.rs", "//! Root.\npub mod base;\npub mod mid;\npub mod side;\npub mod top;\n")
    }

    #[test]
    fn reads_the_table_and_the_exceptions() {
        let rules = Rules::parse(RULES);
        assert_eq!(rules.may_use["side"], BTreeSet::from(["base".to_string()]));
        assert_eq!(rules.may_use["top"].len(), 3);
        assert_eq!(rules.never["base"], BTreeSet::from(["tokio".to_string()]));
        assert_eq!(rules.never["mid"], BTreeSet::from(["hyper".to_string()]));
        assert!(rules.module_arrows.contains(&("side".to_string(), "top".to_string())));
        assert!(rules.file_arrows.contains(&("top/mod.rs".to_string(), "top/b.rs".to_string())));
        assert!(rules.problems.is_empty(), "{:?}", rules.problems);
    }

    #[test]
    fn reports_a_forbidden_arrow_and_a_forbidden_crate() {
        let code = sources(&[
            lib(),
            (
                "base.rs",
                "//! Base.\n// crate::top in a comment\nconst S: &str = \"crate::top\";\nfn f() { tokio::spawn(); }\n",
            ),
            ("mid.rs", "//! Mid.\nuse crate::{\n    base::Thing,\n    top::{self, Top},\n};\n"),
            ("side.rs", "//! Side.\nuse crate::top::Top;\nfn f() { hyper::x(); }\n"),
            ("top/mod.rs", "//! Top.\nuse crate::base::Thing;\n"),
        ]);
        let problems = dependency_problems(&code, RULES);
        let expected = [
            "src/base.rs:4: `base` uses `tokio`",
            "src/mid.rs:4: `mid` uses `top` (`crate::top::",
            "src/side.rs:3: `side` uses `hyper`",
            "exception `side` → `mid` no longer occurs",
        ];
        for expected in expected {
            assert!(problems.iter().any(|problem| problem.contains(expected)), "no {expected:?} in {problems:#?}");
        }
        assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    }

    #[test]
    fn reports_rows_missing_or_in_a_cycle() {
        let rules = RULES.replace("| `base` | std |", "| `base` | `top` |");
        let code = sources(&[lib(), ("extra.rs", "//! Extra.\n")]);
        let problems = dependency_problems(&code, &rules);
        assert!(problems.iter().any(|problem| problem.contains("no row for `extra`")), "{problems:#?}");
        assert!(
            problems.iter().any(|problem| problem.contains("`top` may use each other in a cycle")),
            "{problems:#?}"
        );
    }

    #[test]
    fn reports_a_cycle_between_files() {
        let code = sources(&[
            lib(),
            ("top/mod.rs", "//! Top.\nmod a;\nmod b;\nmod c;\npub use a::A;\npub use c::C;\n"),
            // `a` and `c` import each other; `super::C` goes through the re-export.
            ("top/a.rs", "//! A.\nuse super::C;\npub struct A;\n"),
            ("top/c.rs", "//! C.\npub struct C(super::a::A);\n"),
            // A test module may use anything.
            ("top/b.rs", "//! B.\n#[cfg(test)]\nmod tests {\n    use super::super::a::A;\n}\n"),
        ]);
        let problems = cycle_problems(&code, RULES, &["top"]);
        assert!(
            problems.iter().any(|problem| problem.starts_with("a cycle between `top/a.rs`, `top/c.rs`")),
            "{problems:#?}"
        );
        assert!(problems.iter().any(|problem| problem.contains("`top/mod.rs` → `top/b.rs` closes no cycle")));
        assert_eq!(problems.len(), 2, "{problems:#?}");
    }

    #[test]
    fn allows_a_listed_arrow_and_a_root_that_only_re_exports() {
        let code = sources(&[
            lib(),
            // The root's own code calls `b`, which builds on the root's `Reply`:
            // a cycle, closed by the listed arrow.
            ("top/mod.rs", "//! Top.\nmod a;\nmod b;\npub use a::A;\npub struct Reply;\nfn serve() { b::handle(); }\n"),
            // `a` is only re-exported, so it may use the root.
            ("top/a.rs", "//! A.\npub struct A(super::Reply);\n"),
            ("top/b.rs", "//! B.\nuse super::{A, Reply};\npub fn handle() {}\n"),
        ]);
        let problems = cycle_problems(&code, RULES, &["top"]);
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn reads_paths_but_not_comments_or_literals() {
        let text = "use crate::{\n    job::Job as J,\n    clock,\n};\n\
                    // crate::http in a comment\n\
                    /* crate::http /* nested */ */\n\
                    const Q: u8 = b'\"'; const S: &str = \"crate::http\"; fn f<'a>(x: &'a str) {}\n\
                    const R: &str = r#\"crate::http \" \"#; const C: char = '\\''; const B: &[u8] = br#\"\"\"#;\n\
                    fn g() { crate::storage::open(); }\n";
        let file = scan(text);
        let paths: Vec<(usize, String)> = file.paths.iter().map(|path| (path.line, path.segments.join("::"))).collect();
        let expected = [(2, "crate::job::Job"), (3, "crate::clock"), (9, "crate::storage::open")];
        assert_eq!(paths, expected.map(|(line, path)| (line, path.to_string())));
        assert_eq!(file.paths[0].alias.as_deref(), Some("J"));
        assert!(file.paths.iter().all(|path| path.in_use == (path.line < 9)));
    }

    #[test]
    fn reports_an_over_long_file() {
        let code =
            sources(&[("short.rs", "//! Short.\n"), ("long.rs", "//! Long.\nfn a() {}\nfn b() {}\nfn c() {}\n")]);
        assert_eq!(long_files(&code, 3), ["src/long.rs: 4 lines, more than 3"]);
    }
}
